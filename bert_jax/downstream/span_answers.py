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


def window_best(start: np.ndarray, end: np.ndarray, offset: int, n: int,
                n_best: int, max_answer_length: int):
  """(score, first, last) of the best context span of one window (context
  token indices), or None when the window has no valid pair."""
  if n <= 0:
    return None
  cs = np.asarray(start[offset:offset + n], np.float64)
  ce = np.asarray(end[offset:offset + n], np.float64)
  top_s = np.argsort(-cs, kind="stable")[:n_best]
  top_e = np.argsort(-ce, kind="stable")[:n_best]
  length = top_e[None, :] - top_s[:, None] + 1
  ok = (length >= 1) & (length <= max_answer_length)
  if not ok.any():
    return None
  scores = np.where(ok, cs[top_s][:, None] + ce[top_e][None, :], -np.inf)
  a, b = np.unravel_index(int(np.argmax(scores)), scores.shape)
  return float(scores[a, b]), int(top_s[a]), int(top_e[b])


def best_answers(examples: Sequence[squad_sources.QAExample],
                 span_map: span_features.SpanMap, start_logits, end_logits, *,
                 version_2: bool, n_best: int = 20,
                 max_answer_length: int = 30, null_threshold: float = 0.0
                 ) -> tuple[dict, dict]:
  """({question id: answer text}, {question id: null odds} (v2, else {})).

  `start_logits[f]` / `end_logits[f]`: the logits of feature row f (at
  least as long as the row's tokens).
  """
  predictions, null_odds = {}, {}
  for i, windows in enumerate(span_map.windows_of()):
    ex = examples[i]
    best, min_null = None, np.inf
    for f in windows:
      s, e = start_logits[f], end_logits[f]
      min_null = min(min_null, float(s[0]) + float(e[0]))
      got = window_best(s, e, int(span_map.context_offset[f]),
                        int(span_map.num_context[f]), n_best,
                        max_answer_length)
      if got is not None and (best is None or got[0] > best[0]):
        t0 = int(span_map.token_start[f])
        best = (got[0], t0 + got[1], t0 + got[2])
    text = ""
    if best is not None:
      c0 = int(span_map.char_starts[i][best[1]])
      c1 = int(span_map.char_ends[i][best[2]])
      text = ex.context[c0:c1]
    if version_2:
      odds = NO_SPAN_ODDS if best is None else min_null - best[0]
      null_odds[ex.id] = float(odds)
      if odds > null_threshold:
        text = ""
    predictions[ex.id] = text
  return predictions, null_odds
