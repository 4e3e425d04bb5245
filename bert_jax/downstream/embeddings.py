"""Contextual embeddings from a BERT checkpoint: one vector per sentence.

  python -m bert_jax.embed --model WORKDIR_OR_HF_DIR [--step N] \
      --pooling cls|mean --layer -1 --input sentences.txt --output vectors.npy \
      [--per_token tokens.npz]

`--layer` indexes hidden states as Hugging Face's ``output_hidden_states``
does: 0 is the embeddings output, 1..L the blocks, -1 the last block.
"cls" takes the layer's vector at [CLS] (not the NSP pooler: that one is
untrained in runs without NSP); "mean" averages the real tokens only.
Sentences are sorted by length and padded to a few static lengths (32, 64,
128, ... up to the model's max_position_embeddings), so XLA compiles once per
length in use, never per batch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tokenizers import Tokenizer

from bert_jax import objectives
from bert_jax import pretrained
from bert_jax.hf import tokenizer_files

POOLINGS = ("cls", "mean")


# -----------------------------------------------------------------------------
# Loading: the one place that knows how a --model path becomes a model.
# -----------------------------------------------------------------------------
@dataclasses.dataclass
class LoadedModel:
  params: Any  # Nested dict of float32 arrays (the family's layout).
  model_config: Any
  tokenizer: tokenizer_files.LoadedTokenizer
  untrained_heads: tuple = ()  # e.g. ("mlm_head", "nsp_head") for BertModel.
  family: str = "bert"  # The hf.mapping table: mapping.make_model(family=).


def load_model(path: str, step: int | None = None) -> LoadedModel:
  """The masked LM of a workdir (latest or `step`), a step dir, an
  imported dir, an HF dir or a TF checkpoint, through `bert_jax.pretrained`
  and its objective (``objectives.masked_lm``); the import report says
  which heads were initialized fresh (absent from the source)."""
  source = pretrained.resolve(path, step)
  params, report = pretrained.load_params(source)
  model = objectives.masked_lm(source.config, params)
  return LoadedModel(model.params, model.model_config,
                     pretrained.load_tokenizer(source), tuple(report.fresh),
                     model.family)


# -----------------------------------------------------------------------------
# Tokenization and static shapes.
# -----------------------------------------------------------------------------
def plain_tokenizer(tokenizer, max_length: int | None = None):
  """A private copy of a `tokenizers.Tokenizer` with no padding and, given
  `max_length`, longest-first truncation (specials kept).

  An HF tokenizer.json may pad every text to a fixed length (MiniLM's pads to
  128): those pads would be attended to as real tokens.
  """
  tok = getattr(tokenizer, "tokenizer", tokenizer)
  tok = Tokenizer.from_str(tok.to_str())
  tok.no_padding()
  if max_length is None:
    tok.no_truncation()
  else:
    tok.enable_truncation(int(max_length))
  return tok


def bucket_lengths(max_length: int, smallest: int = 32) -> tuple:
  """(32, 64, 128, ..., max_length): the static sequence lengths compiled."""
  out, b = [], smallest
  while b < max_length:
    out.append(b)
    b *= 2
  return tuple(out) + (int(max_length),)


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  for b in buckets:
    if length <= b:
      return b
  raise ValueError(f"A sequence of {length} tokens exceeds the longest "
                   f"bucket {buckets[-1]}.")


def batches(lengths: Sequence[int], batch_size: int, buckets: Sequence[int]):
  """Yields (example indices, padded length): sorted by length so a batch
  pads only to its bucket; every batch has `batch_size` rows once padded."""
  order = np.argsort(np.asarray(lengths), kind="stable")
  for i in range(0, len(order), batch_size):
    idx = order[i:i + batch_size]
    yield idx, bucket_for(max(lengths[j] for j in idx), buckets)


def pad_batch(rows: Sequence[Sequence[int]], batch_size: int, length: int,
              pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
  """-> (ids [batch_size, length], mask); extra rows are all padding."""
  ids = np.full((batch_size, length), pad_id, np.int32)
  mask = np.zeros((batch_size, length), np.int32)
  for r, row in enumerate(rows):
    ids[r, :len(row)] = row
    mask[r, :len(row)] = 1
  return ids, mask


def check_max_length(max_length: int | None, model_config) -> int:
  limit = int(model_config.max_position_embeddings)
  if max_length is None:
    return limit
  if not 2 <= int(max_length) <= limit:
    raise ValueError(f"max_length={max_length} must be between 2 and the "
                     f"model's max_position_embeddings={limit}.")
  return int(max_length)


# -----------------------------------------------------------------------------
# The forward pass: one jitted function per (model graph, layer, outputs).
# -----------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _forward(graphdef, num_layers: int, per_token: bool):

  def fn(state, ids, mask, seg):
    model = nnx.merge(graphdef, state)
    encoder = getattr(model, "bert", model)
    h = encoder.hidden_states(ids, mask, seg, num_layers)[num_layers]
    h = h.astype(jnp.float32)
    m = mask.astype(jnp.float32)[..., None]
    mean = jnp.sum(h * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1.0)
    out = dict(cls=h[:, 0], mean=mean)
    if per_token:
      out["tokens"] = h
    return out

  return jax.jit(fn)


def resolve_layer(layer: int, num_hidden_layers: int) -> int:
  """HF hidden_states index (0..L, negatives from the end) -> 0..L."""
  n = int(num_hidden_layers)
  if not -(n + 1) <= layer <= n:
    raise ValueError(f"--layer {layer} is out of range: this model has "
                     f"{n} layers, so use 0..{n} or -1..-{n + 1}.")
  return layer % (n + 1)


@dataclasses.dataclass
class TokenVectors:
  """One sentence's per-token vectors with their token strings and ids."""
  tokens: list
  ids: np.ndarray
  vectors: np.ndarray  # [num_tokens, hidden]


def embed(model, tokenizer, sentences: Sequence[str], pooling: str = "cls",
          layer: int = -1, batch_size: int = 32,
          max_length: int | None = None, per_token: bool = False):
  """Sentence vectors [N, hidden] float32 (and per-token vectors).

  `model`: an nnx BertForPreTraining or BertModel (see mapping.make_model);
  `tokenizer`: an tokenizer_files.LoadedTokenizer or a `tokenizers.Tokenizer`. Texts
  longer than `max_length` (default max_position_embeddings) keep their
  first tokens and the final [SEP]. With `per_token`, returns
  (vectors, list of TokenVectors), special tokens included.
  """
  if pooling not in POOLINGS:
    raise ValueError(f"--pooling {pooling!r} must be one of {POOLINGS}.")
  encoder = getattr(model, "bert", model)
  if not hasattr(encoder, "hidden_states"):
    raise ValueError(f"{type(model).__name__} has no BERT encoder to embed "
                     "with (a BERT, DistilBERT or fine-tuned BERT model).")
  config_layers = len(encoder.layers)
  num_layers = resolve_layer(layer, config_layers)
  max_pos = int(encoder.embeddings.position_embeddings[...].shape[0])
  max_length = max_pos if max_length is None else int(max_length)
  if not 2 <= max_length <= max_pos:
    raise ValueError(f"max_length={max_length} must be between 2 and the "
                     f"model's max_position_embeddings={max_pos}.")
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size} must be positive.")
  sentences = list(sentences)
  if not sentences:
    raise ValueError("No sentences to embed.")
  tok = plain_tokenizer(tokenizer, max_length)
  encodings = tok.encode_batch(sentences)
  lengths = [len(e.ids) for e in encodings]
  graphdef, state = nnx.split(model)
  fn = _forward(graphdef, num_layers, per_token)
  hidden = int(encoder.embeddings.word_embeddings[...].shape[1])
  pooled = np.zeros((len(sentences), hidden), np.float32)
  tokens: list = [None] * len(sentences)
  for idx, length in batches(lengths, batch_size,
                             bucket_lengths(max_length)):
    ids, mask = pad_batch([encodings[i].ids for i in idx], batch_size, length)
    seg, _ = pad_batch([encodings[i].type_ids for i in idx], batch_size,
                       length)
    out = fn(state, ids, mask, seg)
    pooled[idx] = np.asarray(out[pooling])[:len(idx)]
    if per_token:
      h = np.asarray(out["tokens"])
      for r, i in enumerate(idx):
        e = encodings[i]
        tokens[i] = TokenVectors(list(e.tokens), np.asarray(e.ids, np.int32),
                                 h[r, :len(e.ids)].copy())
  return (pooled, tokens) if per_token else pooled


def save_per_token(path: str, per_token: Sequence[TokenVectors]) -> None:
  """An .npz: vectors [M, H], tokens [M], ids [M], offsets [N+1] (sentence i
  is rows offsets[i]:offsets[i+1])."""
  offsets = np.cumsum([0] + [len(t.tokens) for t in per_token])
  np.savez(path,
           vectors=np.concatenate([t.vectors for t in per_token]),
           tokens=np.asarray([s for t in per_token for s in t.tokens]),
           ids=np.concatenate([t.ids for t in per_token]),
           offsets=offsets.astype(np.int64))


def read_lines(path: str) -> list[str]:
  """One sentence per line; blank lines are kept so line i -> row i."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--input {path} does not exist.")
  with open(path, encoding="utf-8") as f:
    lines = f.read().splitlines()
  if not lines:
    raise ValueError(f"--input {path} is empty: give one sentence per line.")
  return lines
