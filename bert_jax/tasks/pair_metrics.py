"""Scores of a sentence space on pairs: STS correlation and paraphrase
detection at the best cosine threshold.

  sts       Pearson and Spearman of the pairs' cosine similarities against
            gold scores (sentence-transformers'
            ``EmbeddingSimilarityEvaluator``, cosine)
  binary    accuracy, F1 (with its precision and recall) at the cosine
            threshold that maximises each, and average precision
            (``BinaryClassificationEvaluator``, cosine): the thresholds are
            midpoints between neighbouring distinct similarities, a pair
            counts as positive at similarity >= threshold

numpy only; the similarities are float64 cosines of the float32 vectors.
"""

from __future__ import annotations

import numpy as np

from bert_jax.tasks import sentence_metrics


def cosine(a, b) -> np.ndarray:
  """Row-wise cosine similarity (norms at least 1e-12)."""
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  na = np.maximum(np.linalg.norm(a, axis=-1), 1e-12)
  nb = np.maximum(np.linalg.norm(b, axis=-1), 1e-12)
  return np.sum(a * b, axis=-1) / (na * nb)


def sts(similarity, gold) -> dict[str, float]:
  """{"pearson", "spearman"} of `similarity` against `gold` scores."""
  return dict(pearson=sentence_metrics.pearson(gold, similarity),
              spearman=sentence_metrics.spearman(gold, similarity))


def _groups(similarity, labels):
  """Sorted by similarity, highest first: (the distinct similarities, the
  positives and the pairs at or above each, in cumulative counts)."""
  s = np.asarray(similarity, np.float64).reshape(-1)
  y = np.asarray(labels).reshape(-1).astype(bool)
  order = np.argsort(-s, kind="stable")
  s, y = s[order], y[order]
  last = np.r_[np.flatnonzero(s[1:] != s[:-1]), len(s) - 1]  # group ends
  return s, last, np.cumsum(y)[last], last + 1


def _threshold(s, last, g) -> float:
  """The cut below group g: the midpoint to the next group (the group's
  own similarity for the last one, or when the midpoint rounds onto the
  next)."""
  score = s[last[g]]
  if g == len(last) - 1:
    return float(score)
  nxt = s[last[g] + 1]
  mid = (score + nxt) / 2
  return float(score if mid == nxt else mid)


def binary(similarity, labels) -> dict[str, float]:
  """Best-threshold accuracy and F1, and average precision, of binary
  `labels` (1: a paraphrase) predicted by `similarity`."""
  s, last, tp, n_pred = _groups(similarity, labels)
  n = len(s)
  positives = float(tp[-1]) if n else 0.0
  out = dict(accuracy=(n - positives) / n if n else 0.0,
             accuracy_threshold=float(np.nextafter(s[0], np.inf)) if n
             else -1.0, f1=0.0, f1_threshold=0.0, precision=0.0,
             recall=0.0, average_precision=0.0)
  if not n:
    return out
  fp = n_pred - tp
  acc = (tp + (n - positives - fp)) / n
  best = int(np.argmax(acc))  # The first of equal maxima, as a scan finds.
  if acc[best] > out["accuracy"]:
    out.update(accuracy=float(acc[best]),
               accuracy_threshold=_threshold(s, last, best))
  precision = tp / n_pred
  recall = tp / max(positives, 1.0)
  with np.errstate(invalid="ignore", divide="ignore"):
    f1 = np.where(tp > 0, 2 * precision * recall / (precision + recall), 0.0)
  best = int(np.argmax(f1))
  if f1[best] > 0:
    out.update(f1=float(f1[best]), precision=float(precision[best]),
               recall=float(recall[best]),
               f1_threshold=_threshold(s, last, best))
  if positives:  # sklearn's: sum over thresholds of recall gain x precision.
    out["average_precision"] = float(np.sum(np.diff(np.r_[0.0, recall]) *
                                            precision))
  return out
