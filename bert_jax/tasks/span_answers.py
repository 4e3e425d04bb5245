"""Start / end logits of QA windows -> one answer text per question.

As google-research/bert's ``write_predictions`` and Hugging Face's
``utils_qa.postprocess_qa_predictions``: in every window of a question the
``n_best`` highest start and end logits are paired, a pair kept when it lies
on context tokens, ends at or after its start and spans at most
``max_answer_length`` tokens; its score is start + end logit, and the best
pair over all windows wins (the earliest on ties). The answer is cut from the
original context by the character offsets of its first and last token.

For SQuAD 2.0 the "no answer" score of a window is its [CLS] start + end
logit; the question's null score is the smallest over its windows (as
run_squad). ``null_odds`` = null score - best span score; the prediction is
"" when it exceeds ``null_threshold`` (run_squad's
``null_score_diff_threshold``, default 0).

The n-best list of a question is run_squad's ``nbest_predictions.json``
entry: the candidates of all its windows (and, for v2, the null answer ""
with the [CLS] logits of its min-null window) best first, the first
``n_best`` distinct texts, the null answer appended when it is not among
them; each entry's text, start and end logit, and probability (softmax of
start + end logit over the list). Its first non-empty text is the answer of
``predictions.json`` whenever that is not null. Where run_squad writes a
nonce "empty" for a question without any valid span (v1), the list holds
one entry "" (the prediction), probability 1, logits 0.

Deliberate differences, each small: the n_best candidates are chosen among
context tokens (run_squad takes them over all positions, then drops
question tokens, so its list can hold fewer than n_best context
candidates); run_squad's "maximum context" filter on start positions is not
applied (Hugging Face's utils_qa does not apply it either): a span in the
overlap of two windows is scored in both and the better one wins.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bert_jax.data import span_features
from bert_jax.data import squad_sources

NO_SPAN_ODDS = 1e9  # null_odds of a question with no context token at all.


def window_spans(start: np.ndarray, end: np.ndarray, offset: int, n: int,
                 n_best: int, max_answer_length: int):
  """The valid pairs of one window's `n_best` start and `n_best` end
  context candidates, best first: (score, first, last, start logit, end
  logit) arrays (context token indices), ties in rank order (start rank,
  then end rank); None when the window has no valid pair."""
  if n <= 0:
    return None
  cs = np.asarray(start[offset:offset + n], np.float64)
  ce = np.asarray(end[offset:offset + n], np.float64)
  top_s = np.argsort(-cs, kind="stable")[:n_best]
  top_e = np.argsort(-ce, kind="stable")[:n_best]
  length = top_e[None, :] - top_s[:, None] + 1
  a, b = np.nonzero((length >= 1) & (length <= max_answer_length))
  if not len(a):
    return None
  first, last = top_s[a], top_e[b]
  scores = cs[first] + ce[last]
  order = np.argsort(-scores, kind="stable")
  return (scores[order], first[order], last[order], cs[first][order],
          ce[last][order])


def _softmax(x) -> np.ndarray:
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max())
  return e / e.sum()


def _nbest(context: str, char_starts, char_ends, spans, null, n_best: int
           ) -> list[dict]:
  """run_squad's n-best list of one question (see the module docstring).
  `spans`: the merged window_spans arrays (global token indices), best
  first; `null`: (start logit, end logit) of the null answer, or None."""
  scores, first, last, start_l, end_l = spans
  texts = [context[int(char_starts[f]):int(char_ends[l])]
           for f, l in zip(first, last)]
  logits = list(zip(start_l.tolist(), end_l.tolist()))
  if null is not None:  # Ranked with the spans, after them on ties.
    scores = np.append(scores, null[0] + null[1])
    texts.append("")
    logits.append(null)
  entries, seen = [], set()
  for k in np.argsort(-np.asarray(scores), kind="stable"):
    if len(entries) >= n_best:
      break
    if texts[k] not in seen:
      seen.add(texts[k])
      entries.append((texts[k],) + tuple(logits[k]))
  if null is not None and "" not in seen:
    entries.append(("",) + tuple(null))
  if not entries:  # v1 without a valid span: the prediction "".
    entries.append(("", 0.0, 0.0))
  probs = _softmax([s + e for _, s, e in entries])
  return [dict(text=t, probability=float(p), start_logit=float(s),
               end_logit=float(e)) for (t, s, e), p in zip(entries, probs)]


def best_answers(examples: Sequence[squad_sources.QAExample],
                 span_map: span_features.SpanMap, start_logits, end_logits, *,
                 version_2: bool, n_best: int = 20,
                 max_answer_length: int = 30, null_threshold: float = 0.0
                 ) -> tuple[dict, dict, dict]:
  """({question id: answer text}, {question id: null odds} (v2, else {}),
  {question id: n-best list}): predictions.json, null_odds.json and
  nbest_predictions.json.

  `start_logits[f]` / `end_logits[f]`: the logits of feature row f (at
  least as long as the row's tokens).
  """
  predictions, null_odds, nbest = {}, {}, {}
  for i, windows in enumerate(span_map.windows_of()):
    ex = examples[i]
    parts, min_null, null = [], np.inf, (0.0, 0.0)
    for f in windows:
      s, e = start_logits[f], end_logits[f]
      if float(s[0]) + float(e[0]) < min_null:
        null = (float(s[0]), float(e[0]))
        min_null = null[0] + null[1]
      got = window_spans(s, e, int(span_map.context_offset[f]),
                         int(span_map.num_context[f]), n_best,
                         max_answer_length)
      if got is not None:
        t0 = int(span_map.token_start[f])
        parts.append((got[0], got[1] + t0, got[2] + t0, got[3], got[4]))
    # Windows in order, each best first: the stable sort keeps the earliest
    # window's span on ties.
    spans = tuple(np.concatenate(x) for x in zip(*parts)) if parts else (
        np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64),
        np.zeros(0), np.zeros(0))
    order = np.argsort(-spans[0], kind="stable")
    spans = tuple(x[order] for x in spans)
    text = ""
    if len(order):
      text = ex.context[int(span_map.char_starts[i][spans[1][0]]):
                        int(span_map.char_ends[i][spans[2][0]])]
    if version_2:
      odds = NO_SPAN_ODDS if not len(order) else min_null - float(spans[0][0])
      null_odds[ex.id] = float(odds)
      if odds > null_threshold:
        text = ""
    predictions[ex.id] = text
    nbest[ex.id] = _nbest(ex.context, span_map.char_starts[i],
                          span_map.char_ends[i], spans,
                          null if version_2 else None, n_best)
  return predictions, null_odds, nbest
