"""The batch features, named and shaped in one place.

The input pipeline emits them, the train/eval steps are lowered against them,
tools print and save them and tests build synthetic batches from them. Names
follow google-research/bert. Shapes are per example (the batch dimension is
added by :func:`batch_shapes`); `T` = ``data.seq_length``, `P` =
``data.max_predictions_per_seq``, `S` = ``data.packing_max_sequences``, an
integer a fixed size.

Packed rows (``data.packing``, ``data/packing.py``) hold several examples one
after another, attention kept inside each (``models/attention.py``). They add
:data:`PACKING`: ``sequence_ids`` (which example of the row a token belongs
to: 1, 2, ...; 0 at padding. Not ``segment_ids``, which stays BERT's token
type, sentence A or B, inside each example), ``position_ids`` (restarting at
0 in each example) and ``cls_positions`` (where each example's [CLS] is; 0 in
an empty slot); per-example features become [S] vectors with a weight that
is 0 in empty slots. Padding is the special case of one example a row.
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

# Packed rows, on top of a padded spec.
PACKING = {
    "sequence_ids": (("T",), np.int32),
    "position_ids": (("T",), np.int32),
    "cls_positions": (("S",), np.int32),
}
# Pretraining on packed rows: one NSP/SOP label per packed pair (weight 0 in
# an empty slot; objective "packed" trains no pair head).
PACKED_PRETRAINING = dict(
    PRETRAINING, **PACKING, next_sentence_labels=(("S",), np.int32),
    next_sentence_weights=(("S",), np.float32))


def pretraining_spec(data) -> dict:
  """The pretraining batch features of a `data` config group."""
  return PACKED_PRETRAINING if data.get("packing", False) else PRETRAINING


def packed_inputs(batch) -> dict:
  """The packed-row keyword arguments of the models (none when padded)."""
  return {k: batch[k] for k in PACKING if k in batch}

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
# Fine-tuning on packed rows: a label and a weight per packed example (0 in
# an empty slot), the classifier read at each example's [CLS].
PACKED_CLASSIFICATION = dict(
    CLASSIFICATION, **PACKING, labels=(("S",), np.int32),
    example_weights=(("S",), np.float32))
PACKED_REGRESSION = dict(PACKED_CLASSIFICATION, labels=(("S",), np.float32))


def classification_spec(regression: bool, packed: bool) -> dict:
  """The fine-tuning batch features."""
  if packed:
    return PACKED_REGRESSION if regression else PACKED_CLASSIFICATION
  return REGRESSION if regression else CLASSIFICATION


# Token tagging: a tag id per position; `label_weights` is 1 where a word's
# tag is learned (its first sub-token, in the window that owns the word).
TOKEN_CLASSIFICATION = {
    "input_ids": (("T",), np.int32),
    "input_mask": (("T",), np.int32),
    "segment_ids": (("T",), np.int32),
    "labels": (("T",), np.int32),
    "label_weights": (("T",), np.float32),
}
# Packed rows of token tagging: several sentences' windows a row, labels and
# weights per token as above; `example_weights` [S] marks the occupied slots.
PACKED_TOKEN_CLASSIFICATION = dict(
    TOKEN_CLASSIFICATION, **PACKING, example_weights=(("S",), np.float32))
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


# Sentence pairs for a bi-encoder (task kind "pairs"): per example its K
# texts (anchor, positive, hard negatives; or sentence1, sentence2), each
# padded on its own; `text_ids` names each slot's distinct text (equal ids:
# equal texts; -1: an empty slot), `scores` the gold score (0 without one).
def pair_spec(texts: int) -> dict:
  """The features of examples of `texts` texts each."""
  return {
      "input_ids": ((texts, "T"), np.int32),
      "input_mask": ((texts, "T"), np.int32),
      "segment_ids": ((texts, "T"), np.int32),
      "text_ids": ((texts,), np.int32),
      "scores": ((), np.float32),
      "example_weights": ((), np.float32),
  }


def packed_pair_spec(texts: int) -> dict:
  """Packed pairs (data.packing): a batch's texts several a row, as many
  rows as examples; ``slots`` [texts] is where each of an example's texts
  sits (its row * S + its place in the row; -1: an empty slot)."""
  spec = pair_spec(texts)
  spec.update(PACKING, input_ids=(("T",), np.int32),
              input_mask=(("T",), np.int32), segment_ids=(("T",), np.int32),
              slots=((texts,), np.int32))
  return spec


def batch_shapes(spec: dict, batch_size: int, seq_length: int,
                 max_predictions: int = 0, max_sequences: int = 0
                 ) -> dict[str, tuple[tuple, type]]:
  """{name: ((batch_size, *dims), dtype)} for a feature spec (a dimension
  is "T", "P", "S" or a fixed size)."""
  sizes = {"T": seq_length, "P": max_predictions, "S": max_sequences}
  return {name: ((batch_size,) + tuple(sizes.get(d, d) for d in dims), dtype)
          for name, (dims, dtype) in spec.items()}


def zeros(spec: dict, batch_size: int, seq_length: int,
          max_predictions: int = 0, max_sequences: int = 0
          ) -> dict[str, np.ndarray]:
  """An all-zero batch of the spec's shapes (padding, dry runs)."""
  return {k: np.zeros(s, d) for k, (s, d) in
          batch_shapes(spec, batch_size, seq_length, max_predictions,
                       max_sequences).items()}
