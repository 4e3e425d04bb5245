"""Extractive-QA features: `[CLS] question [SEP] context window [SEP]`.

As google-research/bert's ``run_squad.py``: the question is cut to
``max_query_length`` sub-tokens; the context is covered by windows of
``seq_length - len(question) - 3`` tokens starting every ``doc_stride``
tokens (``feature_batches.window_starts``). The training target of a window
is the token span of the first gold answer when the window holds all of it,
else ``[CLS]`` (position 0), as for an unanswerable question.

Unlike run_squad (which splits the context on whitespace and maps answers
back through words), the context is tokenized as one string with the
character span of every token (``Tokenizer.tokenize_with_offsets``), so an
answer is cut from the original context by character offsets exactly:
whitespace, punctuation, accents and CJK as written. :class:`SpanMap` keeps
what post-processing needs to go from a window position back to them.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from absl import logging

from bert_jax.data import feature_batches
from bert_jax.data import squad_sources
from bert_jax.data import tokenizers


@dataclasses.dataclass
class SpanMap:
  """Per window: its example, where its context starts in the row
  (``context_offset``) and in the example's context tokens
  (``token_start``), and how many context tokens it holds; per example the
  character span of every context token."""
  example: np.ndarray  # [N] int32
  context_offset: np.ndarray  # [N] int32
  token_start: np.ndarray  # [N] int32
  num_context: np.ndarray  # [N] int32
  char_starts: list  # per example: [tokens] int32
  char_ends: list

  def windows_of(self) -> list[np.ndarray]:
    """Per example, its windows (feature rows) in order."""
    order = np.argsort(self.example, kind="stable")
    bounds = np.searchsorted(self.example[order],
                             np.arange(len(self.char_starts) + 1))
    return [order[a:b] for a, b in zip(bounds[:-1], bounds[1:])]


def answer_tokens(starts: np.ndarray, ends: np.ndarray, a0: int, a1: int
                  ) -> tuple[int, int]:
  """Token span [first, last] covering characters [a0, a1): the first token
  ending after a0 and the last starting before a1 ((0, -1) when none)."""
  first = int(np.searchsorted(ends, a0, side="right"))
  last = int(np.searchsorted(starts, a1, side="left")) - 1
  return first, last


def build(examples: Sequence[squad_sources.QAExample],
          tok: tokenizers.Tokenizer, *, seq_length: int,
          max_query_length: int, doc_stride: int
          ) -> tuple[feature_batches.Features, SpanMap]:
  """Windows of every example with their start/end targets."""
  if tok.cls_id is None or tok.sep_id is None:
    raise ValueError(f"Tokenizer {tok.path!r} has no [CLS] or [SEP] token; "
                     "question answering needs both.")
  if doc_stride < 1:
    raise ValueError(f"task.doc_stride={doc_stride} must be >= 1.")
  questions = tok.tokenize_with_offsets([e.question for e in examples])
  contexts = tok.tokenize_with_offsets([e.context for e in examples])
  ids, lengths, seg, starts_t, ends_t = [], [], [], [], []
  example, ctx_off, tok_start, num_ctx = [], [], [], []
  uncovered = 0
  for i, (ex, q, c) in enumerate(zip(examples, questions, contexts)):
    q_ids = q.ids[:max_query_length]
    window = seq_length - len(q_ids) - 3
    if window < 1:
      raise ValueError(
          f"data.seq_length={seq_length} leaves no room for the context of "
          f"question {ex.id!r} after its {len(q_ids)} question tokens "
          f"(task.max_query_length={max_query_length}).")
    first, last = 0, -1
    if ex.answers and not ex.is_impossible:
      text, a0 = ex.answers[0]
      first, last = answer_tokens(c.starts, c.ends, a0, a0 + len(text))
      uncovered += int(first > last)
    offset = len(q_ids) + 2
    head = np.concatenate([[tok.cls_id], q_ids, [tok.sep_id]])
    for st in feature_batches.window_starts(max(len(c.ids), 1), window,
                                            doc_stride):
      n = min(window, len(c.ids) - st)
      row = np.concatenate([head, c.ids[st:st + n], [tok.sep_id]])
      inside = first <= last and st <= first and last < st + n
      ids.append(row)
      lengths.append(len(row))
      seg.append(offset)
      starts_t.append(offset + first - st if inside else 0)
      ends_t.append(offset + last - st if inside else 0)
      example.append(i)
      ctx_off.append(offset)
      tok_start.append(st)
      num_ctx.append(max(n, 0))
  if uncovered:
    logging.warning("%d answers cover no context token (e.g. only "
                    "characters the tokenizer drops): trained as [CLS].",
                    uncovered)
  n_rows = len(ids)
  input_ids = np.zeros([n_rows, seq_length], np.int32)
  for r, row in enumerate(ids):
    input_ids[r, :len(row)] = row
  features = feature_batches.Features(
      input_ids=input_ids, lengths=np.array(lengths, np.int32),
      segment_start=np.array(seg, np.int32),
      arrays=dict(start_positions=np.array(starts_t, np.int32),
                  end_positions=np.array(ends_t, np.int32),
                  example_weights=np.ones([n_rows], np.float32)))
  span_map = SpanMap(np.array(example, np.int32), np.array(ctx_off, np.int32),
                     np.array(tok_start, np.int32),
                     np.array(num_ctx, np.int32),
                     [c.starts for c in contexts], [c.ends for c in contexts])
  return features, span_map
