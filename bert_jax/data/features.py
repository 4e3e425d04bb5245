"""The batch features, named and shaped in one place.

The input pipeline emits them, the train/eval steps are lowered against them,
tools print and save them and tests build synthetic batches from them. Names
follow google-research/bert. Shapes are per example (the batch dimension is
added by :func:`batch_shapes`); `T` = ``data.seq_length``, `P` =
``data.max_predictions_per_seq``.
"""

from __future__ import annotations

import numpy as np

# name -> (shape per example in terms of "T"/"P", numpy dtype)
PRETRAINING = {
    "input_ids": (("T",), np.int32),
    "input_mask": (("T",), np.int32),
    "segment_ids": (("T",), np.int32),
    "masked_lm_positions": (("P",), np.int32),
    "masked_lm_ids": (("P",), np.int32),
    "masked_lm_weights": (("P",), np.float32),
    "next_sentence_labels": ((), np.int32),
}
PRETRAINING_NAMES = tuple(PRETRAINING)

# Sequence classification / regression (fine-tuning). `example_weights` is 0
# for the padding rows that fill the last eval batch (nothing is dropped).
CLASSIFICATION = {
    "input_ids": (("T",), np.int32),
    "input_mask": (("T",), np.int32),
    "segment_ids": (("T",), np.int32),
    "labels": ((), np.int32),
    "example_weights": ((), np.float32),
}
REGRESSION = dict(CLASSIFICATION, labels=((), np.float32))
# Token tagging: a tag id per position; `label_weights` is 1 where a word's
# tag is learned (its first sub-token, in the window that owns the word).
TOKEN_CLASSIFICATION = {
    "input_ids": (("T",), np.int32),
    "input_mask": (("T",), np.int32),
    "segment_ids": (("T",), np.int32),
    "labels": (("T",), np.int32),
    "label_weights": (("T",), np.float32),
}
# Extractive QA: the answer's first and last token (0 = [CLS]: no answer in
# this window).
SPAN_QA = {
    "input_ids": (("T",), np.int32),
    "input_mask": (("T",), np.int32),
    "segment_ids": (("T",), np.int32),
    "start_positions": ((), np.int32),
    "end_positions": ((), np.int32),
    "example_weights": ((), np.float32),
}


def batch_shapes(spec: dict, batch_size: int, seq_length: int,
                 max_predictions: int = 0) -> dict[str, tuple[tuple, type]]:
  """{name: ((batch_size, *dims), dtype)} for a feature spec."""
  sizes = {"T": seq_length, "P": max_predictions}
  return {name: ((batch_size,) + tuple(sizes[d] for d in dims), dtype)
          for name, (dims, dtype) in spec.items()}


def zeros(spec: dict, batch_size: int, seq_length: int,
          max_predictions: int = 0) -> dict[str, np.ndarray]:
  """An all-zero batch of the spec's shapes (padding, dry runs)."""
  return {k: np.zeros(s, d) for k, (s, d) in
          batch_shapes(spec, batch_size, seq_length, max_predictions).items()}
