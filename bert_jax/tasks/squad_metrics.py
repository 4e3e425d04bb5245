"""SQuAD exact match and F1 with the official scripts' semantics.

Answers are normalised as ``evaluate-v1.1.py`` / ``evaluate-v2.0.py`` do:
lower case, ASCII punctuation (``string.punctuation``) removed, the articles
a / an / the removed, whitespace collapsed. Other Unicode punctuation stays,
as in the official scripts. A prediction scores the maximum over the gold
answers.

* v1.1: every question has answers; F1 is token-overlap F1 (0 when no
  token is shared).
* v2.0: gold answers that normalise to "" are dropped, and a question
  without any is compared with gold ""; F1 of an empty side is 1 when both
  are empty, else 0. Then, in the official order
  (``apply_no_ans_threshold``), a question whose null odds (score of "no
  answer" minus that of the best span, ``null_odds.json``) exceed the
  threshold is predicted unanswerable and scores 1 when it has no gold
  answers, else 0, whatever the texts: an answerable question whose gold
  answers all normalise to "" and whose null answer won scores 0. Scores
  are also given for the answerable (``HasAns_``) and unanswerable
  (``NoAns_``) questions, and the best scores over thresholds with the
  thresholds that reach them (``best_exact_thresh``, ``best_f1_thresh``),
  by the official ``find_best_thresh`` on the scores before thresholding.
  The official script, given our predictions.json and null_odds.json with
  ``--na-prob-thresh`` equal to the threshold the predictions were made
  with, prints the same numbers (x100).

Scores here are fractions (0..1) like every bert_jax metric; thresholds are
null-odds values (logits), returned apart from the scores.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Mapping, Optional, Sequence

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
  """Lower case, no ASCII punctuation, no articles, single spaces."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCT)
  return " ".join(_ARTICLES.sub(" ", s).split())


def exact(gold: str, pred: str) -> float:
  return float(normalize_answer(gold) == normalize_answer(pred))


def f1(gold: str, pred: str, version_2: bool = True) -> float:
  g, p = normalize_answer(gold).split(), normalize_answer(pred).split()
  if version_2 and (not g or not p):
    return float(g == p)
  same = sum((collections.Counter(g) & collections.Counter(p)).values())
  if same == 0:
    return 0.0
  precision, recall = same / len(p), same / len(g)
  return 2 * precision * recall / (precision + recall)


def gold_texts(answers: Sequence[str], version_2: bool) -> list[str]:
  """The answers a prediction is compared with ([""]: unanswerable)."""
  if not version_2:
    return list(answers)
  kept = [a for a in answers if normalize_answer(a)]
  return kept or [""]


def raw_scores(gold: Mapping[str, Sequence[str]], preds: Mapping[str, str],
               version_2: bool) -> tuple[dict, dict]:
  """Per question id: (exact, F1), each the max over its gold answers. A
  question without a prediction scores 0 in v1.1 and is left out in v2.0,
  as the official scripts do."""
  ex, fs = {}, {}
  for qid, answers in gold.items():
    if qid not in preds:
      if not version_2:
        ex[qid] = fs[qid] = 0.0
      continue
    golds = gold_texts(answers, version_2)
    ex[qid] = max(exact(a, preds[qid]) for a in golds)
    fs[qid] = max(f1(a, preds[qid], version_2) for a in golds)
  return ex, fs


def _mean(scores: Mapping[str, float], ids) -> float:
  ids = list(ids)
  return sum(scores[q] for q in ids) / len(ids) if ids else 0.0


def find_best_thresh(preds, scores, na_probs, has_ans) -> tuple[float, float]:
  """The official search: (best score fraction, its threshold)."""
  cur = best = sum(1 for q in has_ans if not has_ans[q])
  thresh = 0.0
  for qid in sorted(na_probs, key=lambda q: na_probs[q]):
    if qid not in scores:
      continue
    if has_ans[qid]:
      diff = scores[qid]
    else:
      diff = -1 if preds[qid] else 0
    cur += diff
    if cur > best:
      best, thresh = cur, na_probs[qid]
  return best / len(scores) if scores else 0.0, float(thresh)


def apply_no_ans_threshold(scores: Mapping[str, float],
                           na_probs: Mapping[str, float],
                           has_ans: Mapping[str, bool],
                           na_prob_thresh: float) -> dict:
  """The official step: a question whose null odds exceed the threshold is
  predicted unanswerable and scores `not has_ans`, whatever its text."""
  return {q: float(not has_ans[q]) if na_probs[q] > na_prob_thresh else s
          for q, s in scores.items()}


def evaluate(gold: Mapping[str, Sequence[str]], preds: Mapping[str, str],
             version_2: bool, null_odds: Optional[Mapping[str, float]] = None,
             na_prob_thresh: float = 1.0) -> tuple[dict, dict]:
  """(scores, extras) of predictions {id: text} against gold {id: [texts]}.

  scores: exact, f1 (and for v2 HasAns_/NoAns_ exact and f1, best_exact,
  best_f1), fractions over the questions that have a prediction. extras:
  counts of questions and, for v2 with null odds, best_exact_thresh and
  best_f1_thresh. A question is answerable when it has gold answers (v2's
  qid_to_has_ans), even if they all normalise to "".

  `na_prob_thresh` is the official ``--na-prob-thresh`` (its default 1.0):
  pass the threshold the predictions were made with. Without null odds
  every question's odds are 0, as in the official script without
  ``--na-prob-file``.
  """
  ex, fs = raw_scores(gold, preds, version_2)
  if not version_2:
    return dict(exact=_mean(ex, ex), f1=_mean(fs, fs)), dict(
        total=len(ex), missing=sum(q not in preds for q in gold))
  has_ans = {q: bool(a) for q, a in gold.items()}
  na_probs = null_odds if null_odds is not None else {q: 0.0 for q in preds}
  ex_t = apply_no_ans_threshold(ex, na_probs, has_ans, na_prob_thresh)
  fs_t = apply_no_ans_threshold(fs, na_probs, has_ans, na_prob_thresh)
  scores = dict(exact=_mean(ex_t, ex_t), f1=_mean(fs_t, fs_t))
  extras = dict(total=len(ex), missing=sum(q not in preds for q in gold))
  has, no = [q for q in ex if has_ans[q]], [q for q in ex if not has_ans[q]]
  extras.update(HasAns_total=len(has), NoAns_total=len(no))
  if has:
    scores.update(HasAns_exact=_mean(ex_t, has), HasAns_f1=_mean(fs_t, has))
  if no:
    scores.update(NoAns_exact=_mean(ex_t, no), NoAns_f1=_mean(fs_t, no))
  if null_odds is not None:
    scores["best_exact"], extras["best_exact_thresh"] = find_best_thresh(
        preds, ex, null_odds, has_ans)
    scores["best_f1"], extras["best_f1_thresh"] = find_best_thresh(
        preds, fs, null_odds, has_ans)
  return scores, extras
