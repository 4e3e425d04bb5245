"""Vocabulary rows: trimmed to the tokenizer on export, padded on import.

A run's embedding table may have more rows than its tokenizer has tokens
(``model.vocab_size`` rounded up, or the default 30,522 with a SentencePiece
model that a small corpus caps near 4,000 pieces). Those rows are no token:
``fill_mask`` never predicts them, but Hugging Face's ``pipeline("fill-mask")``
would, decoding them as empty strings. So an export keeps only the
tokenizer's rows (``config.json`` ``vocab_size`` == the tokenizer's size), and
a trimmed export loaded into a config with a larger table gets rows added
back (:func:`pad`). The params with one row per token id, in every family's
tree, are the word table and the MLM decoder's bias (the tied decoder weight
is the word table). numpy only.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from bert_jax.hf import mapping

# Our param paths (suffixes) with one row per token id: BERT-style tables
# and MLM biases, ModernBERT's token table and decoder bias.
ROW_PARAMS = ("word_embeddings", "mlm_head.bias", "tok_embeddings",
              "decoder.bias")


def rows(params: Mapping[str, Any]) -> int | None:
  """The number of vocabulary rows of `params` (None: it has none)."""
  sizes = {int(np.shape(v)[0])
           for k, v in mapping.flatten_params(params).items()
           if k.endswith(ROW_PARAMS)}
  if len(sizes) > 1:
    raise ValueError(f"The params' vocabulary rows disagree: {sorted(sizes)}.")
  return sizes.pop() if sizes else None


def trim(params: Mapping[str, Any], n: int) -> dict:
  """`params` with their vocabulary rows cut to the first `n`."""
  return mapping.unflatten_params({
      k: (np.asarray(v)[:n] if k.endswith(ROW_PARAMS) else v)
      for k, v in mapping.flatten_params(params).items()})


def pad(params: Mapping[str, Any], n: int, *, initializer_range: float = 0.02,
        seed: int = 0) -> dict:
  """`params` with vocabulary rows added up to `n`: word-table rows drawn as
  a fresh init draws them (normal, `initializer_range`), MLM biases 0.

  Rows past the tokenizer are never an input and never predicted; as MLM
  targets they only receive the softmax's push down, like the spare rows of
  a run that was padded from its start.
  """
  rng = np.random.default_rng(seed)
  out = {}
  for k, v in mapping.flatten_params(params).items():
    v = np.asarray(v)
    if k.endswith(ROW_PARAMS) and v.shape[0] < n:
      extra = (n - v.shape[0],) + v.shape[1:]
      new = (np.zeros(extra, v.dtype) if k.endswith("bias") else
             (initializer_range * rng.standard_normal(extra)).astype(v.dtype))
      v = np.concatenate([v, new])
    out[k] = v
  return mapping.unflatten_params(out)
