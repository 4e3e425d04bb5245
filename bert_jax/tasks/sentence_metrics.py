"""Downstream metrics on whole validation splits, weighted by example_weights.

Every metric takes numpy arrays over all eval rows (padding rows carry weight
0 and are ignored; other weights count as that many copies of the row, which
is what a weighted confusion matrix or weighted moments give). Degenerate
inputs (one class only, constant predictions) give 0, never NaN, as
scikit-learn does for MCC and F1.

The official GLUE metrics per task are in ``task_sources.GLUE[...].metrics``;
:func:`task_scores` computes them and :func:`glue_average` combines tasks the
way the GLUE leaderboard does.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from bert_jax.data import task_sources


def _w(weights: Optional[np.ndarray], n: int) -> np.ndarray:
  if weights is None:
    return np.ones([n], np.float64)
  w = np.asarray(weights, np.float64).reshape(-1)
  if w.shape[0] != n:
    raise ValueError(f"example_weights has {w.shape[0]} rows, predictions "
                     f"{n}.")
  return w


def _flat(x) -> np.ndarray:
  return np.asarray(x).reshape(-1)


def _div(a: float, b: float) -> float:
  return float(a / b) if b > 0 else 0.0


def accuracy(labels, preds, weights=None) -> float:
  labels, preds = _flat(labels), _flat(preds)
  w = _w(weights, len(labels))
  return _div(np.sum(w * (labels == preds)), np.sum(w))


def f1(labels, preds, weights=None, positive: int = 1) -> float:
  """Binary F1 of class ``positive``: 2 TP / (2 TP + FP + FN)."""
  labels, preds = _flat(labels), _flat(preds)
  w = _w(weights, len(labels))
  tp = np.sum(w * ((preds == positive) & (labels == positive)))
  fp = np.sum(w * ((preds == positive) & (labels != positive)))
  fn = np.sum(w * ((preds != positive) & (labels == positive)))
  return _div(2 * tp, 2 * tp + fp + fn)


def matthews_corrcoef(labels, preds, weights=None) -> float:
  """Multiclass MCC (Gorodkin's R_K, as scikit-learn) from the weighted
  confusion matrix; 0 when either side has a single class."""
  labels, preds = _flat(labels).astype(np.int64), _flat(preds).astype(np.int64)
  w = _w(weights, len(labels))
  keep = w > 0
  labels, preds, w = labels[keep], preds[keep], w[keep]
  if not len(w):
    return 0.0
  k = int(max(labels.max(), preds.max())) + 1
  cm = np.zeros([k, k])
  np.add.at(cm, (labels, preds), w)
  t, p = cm.sum(axis=1), cm.sum(axis=0)  # true / predicted totals per class
  s, c = cm.sum(), np.trace(cm)
  cov_ytyp = c * s - t @ p
  cov_ypyp = s * s - p @ p
  cov_ytyt = s * s - t @ t
  denom = np.sqrt(cov_ytyt * cov_ypyp)
  return _div(cov_ytyp, denom)


def pearson(labels, preds, weights=None) -> float:
  """Weighted Pearson correlation; 0 if either side is constant."""
  x, y = _flat(labels).astype(np.float64), _flat(preds).astype(np.float64)
  w = _w(weights, len(x))
  sw = np.sum(w)
  if sw <= 0:
    return 0.0
  mx, my = np.sum(w * x) / sw, np.sum(w * y) / sw
  cov = np.sum(w * (x - mx) * (y - my))
  vx, vy = np.sum(w * (x - mx) ** 2), np.sum(w * (y - my) ** 2)
  return _div(cov, np.sqrt(vx * vy))


def average_ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks, tied values sharing the mean of their ranks."""
  x = _flat(x)
  order = np.argsort(x, kind="stable")
  sx = x[order]
  # Start of each run of equal values, and the mean rank of the run.
  starts = np.r_[0, np.flatnonzero(sx[1:] != sx[:-1]) + 1]
  ends = np.r_[starts[1:], len(x)]
  run_rank = (starts + 1 + ends) / 2.0  # mean of starts+1 .. ends
  ranks = np.empty(len(x))
  ranks[order] = np.repeat(run_rank, ends - starts)
  return ranks


def spearman(labels, preds, weights=None) -> float:
  """Pearson of the average ranks over rows with weight > 0 (weighted)."""
  x, y = _flat(labels), _flat(preds)
  w = _w(weights, len(x))
  keep = w > 0
  if not keep.any():
    return 0.0
  return pearson(average_ranks(x[keep]), average_ranks(y[keep]), w[keep])


METRICS = {
    task_sources.ACCURACY: accuracy, task_sources.F1: f1, task_sources.MCC: matthews_corrcoef,
    task_sources.PEARSON: pearson, task_sources.SPEARMAN: spearman,
}


def predictions(outputs: np.ndarray, spec: task_sources.TaskSpec) -> np.ndarray:
  """Logits [N, num_labels] -> class ids; regression outputs -> floats."""
  outputs = np.asarray(outputs)
  if spec.regression:
    return outputs.reshape(-1).astype(np.float64)
  return outputs.argmax(axis=-1)


def task_scores(spec: task_sources.TaskSpec, labels, preds, weights=None
                ) -> dict[str, float]:
  """The task's official metrics, {metric name: value}."""
  return {m: METRICS[m](labels, preds, weights) for m in spec.metrics}


def main_score(scores: Mapping[str, float]) -> float:
  """One number per task (per eval split): the mean of its metrics."""
  if not scores:
    raise ValueError("No metric to average.")
  return float(np.mean([float(v) for v in scores.values()]))


def glue_average(results: Mapping[str, Mapping[str, Mapping[str, float]]]
                 ) -> float:
  """GLUE score: mean over tasks of each task's main score.

  ``results`` is {task: {eval split: {metric: value}}}. A task with two
  metrics (MRPC/QQP F1 and accuracy, STS-B Pearson and Spearman) scores their
  mean; MNLI's matched and mismatched accuracies count as two entries (this
  reproduces the "Average" of Devlin et al. 2019, Table 1).
  """
  entries = [main_score(scores) for splits in results.values()
             for scores in splits.values()]
  if not entries:
    raise ValueError("glue_average needs at least one task result.")
  return float(np.mean(entries))


def format_table(results: Mapping[str, Mapping[str, Mapping[str, float]]]
                 ) -> str:
  """A printable table: task, split, metrics (x100, as papers report)."""
  lines = [f"{'task':<12} {'split':<22} metrics"]
  for task, splits in results.items():
    for split, scores in splits.items():
      body = "  ".join(f"{k}={100 * v:.2f}" for k, v in scores.items())
      lines.append(f"{task:<12} {split:<22} {body}")
  if len(results) > 1:
    lines.append(f"{'average':<12} {'':<22} {100 * glue_average(results):.2f}")
  return "\n".join(lines)

