"""Tokenized texts packed several a row, for inference over many texts.

Fill-mask and embeddings over a file compute no padding: a chunk of texts
is bin-packed into rows (``data/feature_packing``: best-fit decreasing over
the whole chunk, at most `max_sequences` texts a row); each text attends
only to itself and has its own positions (``sequence_ids``,
``position_ids``), so its outputs are the ones it gets alone. A row is
`seq_length` slots, or, when a chunk holds a longer text, `seq_length`
doubled until it holds it (at most the model's positions); batches have
`batch_size` rows (the last filled with empty rows), so XLA compiles once
per row length in use, never per batch. ``example_index`` [B, S] names
each slot's text (-1: empty).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bert_jax.data import feature_batches
from bert_jax.data import feature_packing

INDEX = feature_packing.INDEX
DEFAULT_SEQ_LENGTH = 128
DEFAULT_MAX_SEQUENCES = 16


def row_length(longest: int, seq_length: int, max_positions: int) -> int:
  """`seq_length` (at most `max_positions`), doubled until it holds
  `longest` tokens (at most `max_positions`)."""
  t = min(int(seq_length), int(max_positions))
  while t < longest:
    t = min(2 * t, int(max_positions))
    if t == max_positions and t < longest:
      raise ValueError(f"A text of {longest} tokens exceeds the model's "
                       f"{max_positions} positions.")
  return t


def check(seq_length: int, max_sequences: int, batch_size: int) -> None:
  """The packing flags' ranges (one error naming the flag)."""
  if seq_length < 2:
    raise ValueError(f"--seq_length={seq_length} must be >= 2.")
  if not 1 <= max_sequences <= seq_length // 2:
    raise ValueError(f"--max_sequences={max_sequences} must be in [1, "
                     f"--seq_length / 2 = {seq_length // 2}].")
  if batch_size < 1:
    raise ValueError(f"--batch_size={batch_size} must be positive.")


def batches(ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]],
            *, seq_length: int, max_sequences: int, batch_size: int,
            max_positions: int, pad_id: int = 0) -> list[dict]:
  """Packed batches of the texts `ids` (token types `type_ids`: 0 before
  a text's second segment, 1 from it on)."""
  lengths = np.asarray([len(x) for x in ids], np.int32)
  t = row_length(int(lengths.max()), seq_length, max_positions)
  s = min(int(max_sequences), t // 2)
  input_ids = np.full((len(ids), t), pad_id, np.int32)
  starts = np.zeros(len(ids), np.int32)
  for i, (row, types) in enumerate(zip(ids, type_ids)):
    input_ids[i, :len(row)] = row
    second = np.flatnonzero(np.asarray(types) > 0)
    starts[i] = second[0] if len(second) else len(row)
  features = feature_batches.Features(input_ids, lengths, {},
                                      segment_start=starts)
  return feature_packing.eval_batches(
      features, batch_size=batch_size, pad_id=pad_id,
      shape=feature_packing.Shape(t, s, window=len(ids)))
