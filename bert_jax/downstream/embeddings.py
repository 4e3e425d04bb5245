"""Contextual embeddings from any encoder: one vector per sentence.

  python -m bert_jax.embed --model WORKDIR_OR_HF_DIR [--step N] \
      --pooling cls|mean --layer -1 --input sentences.txt --output vectors.npy \
      [--per_token tokens.npz]

The model is the encoder the run holds (``compose.encoder_params``: BERT's,
ELECTRA's discriminator, DistilBERT's student, ModernBERT's, a fine-tuned
head's encoder). `--layer` indexes hidden states as Hugging Face's
``output_hidden_states`` does: 0 is the embeddings output, 1..L the blocks,
-1 the last block.
"cls" takes the layer's vector at [CLS] (not the NSP pooler: that one is
untrained in runs without NSP); "mean" averages the real tokens only.
Sentences are sorted by length and padded to a few static lengths (32, 64,
128, ... up to the model's max_position_embeddings), so XLA compiles once per
length in use, never per batch; or, with ``packing=True`` (the CLI's
default), packed several a row (``packed_texts``), each attending only to
itself: the same vectors, no padding computed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import shutil
import tempfile
import zipfile
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tokenizers import Tokenizer

from bert_jax import compose
from bert_jax import pretrained
from bert_jax.downstream import packed_texts
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files
from bert_jax.models import heads

POOLINGS = ("cls", "mean")


# -----------------------------------------------------------------------------
# Loading: the one place that knows how a --model path becomes a model.
# -----------------------------------------------------------------------------
@dataclasses.dataclass
class LoadedModel:
  params: Any  # Nested dict of float32 arrays (the table's layout).
  model_config: Any
  tokenizer: tokenizer_files.LoadedTokenizer
  table: mapping.Table  # mapping.make_model(params, model_config, table)
  untrained_heads: tuple = ()  # e.g. ("mlm_head", "nsp_head") for BertModel.


def load_model(path: str, step: int | None = None) -> LoadedModel:
  """The encoder of a workdir (latest or `step`), a step dir, an imported
  dir, an HF dir or a TF checkpoint (``compose.encoder_params``), as its
  family's bare encoder (``mapping.make_model`` builds a
  ``models.heads.EncoderModel``)."""
  source = pretrained.resolve(path, step)
  params, _ = pretrained.load_params(source)
  if source.config is None:  # A weights file without config: one error.
    pretrained.load_model_config(source)
  model_config, encoder = compose.bare_encoder(source.config, params)
  return LoadedModel(encoder, model_config, pretrained.load_tokenizer(source),
                     compose.family(source.config).encoder_table)


def load_masked_lm(path: str, step: int | None = None) -> LoadedModel:
  """The masked LM of a run or directory (``compose.masked_lm``; ELECTRA's
  generator); the import report says which heads were initialized fresh
  (absent from the source)."""
  source = pretrained.resolve(path, step)
  params, report = pretrained.load_params(source)
  model = compose.masked_lm(source.config, params)
  return LoadedModel(model.params, model.model_config,
                     pretrained.load_tokenizer(source), model.table,
                     tuple(report.fresh))


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
    encoder = nnx.merge(graphdef, state).encoder
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


@functools.lru_cache(maxsize=16)
def _packed_forward(graphdef, num_layers: int, per_token: bool):
  """`_forward` on packed rows (``packed_texts``): [B, S] pooled vectors,
  each sequence's own [CLS] or mean (``heads.pool_tokens``)."""

  def fn(state, batch):
    encoder = nnx.merge(graphdef, state).encoder
    ids, mask = batch["input_ids"], batch["input_mask"]
    seq, cls = batch["sequence_ids"], batch["cls_positions"]
    h = encoder.hidden_states(ids, mask, batch["segment_ids"], num_layers,
                              sequence_ids=seq,
                              position_ids=batch["position_ids"])[num_layers]
    h = h.astype(jnp.float32)
    out = {p: heads.pool_tokens(h, mask, p, seq, cls) for p in POOLINGS}
    if per_token:
      out["tokens"] = h
    return out

  return jax.jit(fn)


def packed_chunk(job: "_Embedder", sentences: Sequence[str]):
  """`_Embedder.chunk` on packed rows: several sentences a row of
  `job.seq_length` tokens (grown for a longer one), each attending only to
  itself with its own positions, `job.batch_size` rows a batch; the same
  vectors as one sentence a row."""
  encodings = job.tok.encode_batch(list(sentences))
  pooled = np.zeros((len(encodings), job.hidden), np.float32)
  tokens: list = [None] * len(encodings)
  names = ("input_ids", "input_mask", "segment_ids", "sequence_ids",
           "position_ids", "cls_positions")
  for b in packed_texts.batches(
      [e.ids for e in encodings], [e.type_ids for e in encodings],
      seq_length=job.seq_length, max_sequences=job.max_sequences,
      batch_size=job.batch_size, max_positions=job.max_length):
    out = job.packed_fn(job.state, {k: b[k] for k in names})
    index = b[packed_texts.INDEX]
    used = index >= 0
    pooled[index[used]] = np.asarray(out[job.pooling])[used]
    if job.per_token:
      h = np.asarray(out["tokens"])
      for r, s in zip(*np.nonzero(used)):
        e = encodings[index[r, s]]
        start = int(b["cls_positions"][r, s])
        tokens[index[r, s]] = TokenVectors(
            list(e.tokens), np.asarray(e.ids, np.int32),
            h[r, start:start + len(e.ids)].copy())
  return pooled, (tokens if job.per_token else None)


class _Embedder:
  """The checks and the compiled forward pass of one embedding job."""

  def __init__(self, model, tokenizer, pooling: str, layer: int,
               batch_size: int, max_length: int | None, per_token: bool,
               packing: bool = False,
               seq_length: int = packed_texts.DEFAULT_SEQ_LENGTH,
               max_sequences: int = packed_texts.DEFAULT_MAX_SEQUENCES):
    if pooling not in POOLINGS:
      raise ValueError(f"--pooling {pooling!r} must be one of {POOLINGS}.")
    if not isinstance(model, heads.EncoderModel):
      raise ValueError(f"{type(model).__name__} is not an encoder to embed "
                       "with: load one with load_model (any family's "
                       "encoder, bert_jax.models.heads.EncoderModel).")
    num_layers = resolve_layer(layer, len(model.encoder.layers))
    max_pos, self.hidden = model.max_positions, model.hidden_size
    max_length = max_pos if max_length is None else int(max_length)
    if not 2 <= max_length <= max_pos:
      raise ValueError(f"max_length={max_length} must be between 2 and the "
                       f"model's max_position_embeddings={max_pos}.")
    if batch_size < 1:
      raise ValueError(f"batch_size={batch_size} must be positive.")
    self.tok = plain_tokenizer(tokenizer, max_length)
    self.buckets = bucket_lengths(max_length)
    graphdef, self.state = nnx.split(model)
    self.fn = _forward(graphdef, num_layers, per_token)
    self.pooling, self.batch_size, self.per_token = (pooling, batch_size,
                                                     per_token)
    # Packed rows (packed_chunk): batch_size counts rows of seq_length.
    self.packing, self.max_length = packing, max_length
    if packing:
      packed_texts.check(seq_length, max_sequences, batch_size)
      self.packed_fn = _packed_forward(graphdef, num_layers, per_token)
    self.seq_length, self.max_sequences = seq_length, max_sequences

  def chunk(self, sentences: Sequence[str]):
    """(pooled [n, hidden], TokenVectors per sentence or None), in order.

    Packed rows (``packed_chunk``), or sorted by length within the chunk,
    so that a batch pads only to its bucket.
    """
    if self.packing:
      return packed_chunk(self, sentences)
    encodings = self.tok.encode_batch(list(sentences))
    lengths = [len(e.ids) for e in encodings]
    pooled = np.zeros((len(encodings), self.hidden), np.float32)
    tokens: list = [None] * len(encodings)
    for idx, length in batches(lengths, self.batch_size, self.buckets):
      ids, mask = pad_batch([encodings[i].ids for i in idx], self.batch_size,
                            length)
      seg, _ = pad_batch([encodings[i].type_ids for i in idx],
                         self.batch_size, length)
      out = self.fn(self.state, ids, mask, seg)
      pooled[idx] = np.asarray(out[self.pooling])[:len(idx)]
      if self.per_token:
        h = np.asarray(out["tokens"])
        for r, i in enumerate(idx):
          e = encodings[i]
          tokens[i] = TokenVectors(list(e.tokens),
                                   np.asarray(e.ids, np.int32),
                                   h[r, :len(e.ids)].copy())
    return pooled, (tokens if self.per_token else None)


# Sentences embedded together: memory is bounded by one chunk's inputs and
# outputs, whatever the input size; within it, sorting by length keeps the
# padding low.
CHUNK_SENTENCES = 4096


def embed(model, tokenizer, sentences: Sequence[str], pooling: str = "cls",
          layer: int = -1, batch_size: int = 32,
          max_length: int | None = None, per_token: bool = False,
          **packing):
  """Sentence vectors [N, hidden] float32 (and per-token vectors), in memory.

  `model`: any family's encoder (``models.heads.EncoderModel``: the
  ``mapping.make_model`` of a :func:`load_model`);
  `tokenizer`: an tokenizer_files.LoadedTokenizer or a `tokenizers.Tokenizer`. Texts
  longer than `max_length` (default max_position_embeddings) keep their
  first tokens and the final [SEP]. With `per_token`, returns
  (vectors, list of TokenVectors), special tokens included. For inputs of
  any size, `write_embeddings` streams the same numbers to files.
  `packing`: ``packing=True`` (several sentences a row, ``packed_chunk``;
  `batch_size` then counts rows), ``seq_length``, ``max_sequences``.
  """
  job = _Embedder(model, tokenizer, pooling, layer, batch_size, max_length,
                  per_token, **packing)
  sentences = list(sentences)
  if not sentences:
    raise ValueError("No sentences to embed.")
  pooled, tokens = [], []
  for i in range(0, len(sentences), CHUNK_SENTENCES):
    p, t = job.chunk(sentences[i:i + CHUNK_SENTENCES])
    pooled.append(p)
    tokens.extend(t or [])
  pooled = np.concatenate(pooled)
  return (pooled, tokens) if per_token else pooled


# -----------------------------------------------------------------------------
# Streaming to files: .npy rows and .npz members written as they are made.
# -----------------------------------------------------------------------------
def _npy_header(dtype, shape) -> bytes:
  """The header np.save writes for an array of `dtype` and `shape`."""
  buf = io.BytesIO()
  np.lib.format.write_array_header_1_0(buf, {
      "descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
      "fortran_order": False, "shape": tuple(int(n) for n in shape)})
  return buf.getvalue()


def _copy_member(zf: zipfile.ZipFile, name: str, dtype, shape, raw) -> None:
  """A .npy member of `zf` from the raw bytes in file object `raw`."""
  with zf.open(name, "w", force_zip64=True) as member:
    member.write(_npy_header(dtype, shape))
    raw.seek(0)
    shutil.copyfileobj(raw, member, 1 << 20)


def write_embeddings(model, tokenizer, input_path: str, output: str,
                     per_token_path: str | None = None, *,
                     pooling: str = "cls", layer: int = -1,
                     batch_size: int = 32, max_length: int | None = None,
                     **packing) -> tuple[int, int, int]:
  """`embed` of every line of `input_path`, streamed: `output` (.npy, [N,
  hidden] float32) and, with `per_token_path`, an .npz like
  `save_per_token`'s. Returns (N, hidden, token vectors). `packing`: as
  `embed`'s.

  Memory stays that of one chunk of CHUNK_SENTENCES sentences for any input
  size: a first pass counts lines (and tokens), so the files' headers are
  known; the second writes rows as chunks are embedded (the per-token
  strings, ids and offsets are spooled to temporary files and copied into
  the .npz after its vectors). Both files are written beside their paths and
  renamed when complete: a failure leaves neither.
  """
  job = _Embedder(model, tokenizer, pooling, layer, batch_size, max_length,
                  bool(per_token_path), **packing)
  finals = [output] + ([per_token_path] if per_token_path else [])
  partial = [f"{path}.tmp{os.getpid()}" for path in finals]
  try:
    with tempfile.TemporaryDirectory(
        dir=os.path.dirname(os.path.abspath(output))) as spool:
      counts = _write_streams(job, input_path, partial, spool)
    for src, dst in zip(partial, finals):
      os.replace(src, dst)
  finally:
    for path in partial:
      if os.path.exists(path):
        os.remove(path)
  return counts


def _write_streams(job: _Embedder, input_path: str, paths: list[str],
                   spool: str) -> tuple[int, int, int]:
  """The two passes of `write_embeddings` into `paths` (.npy[, .npz])."""
  n = m = 0
  width = 1
  offsets = open(os.path.join(spool, "offsets"), "w+b")
  tokens = open(os.path.join(spool, "tokens"), "w+b")
  ids = open(os.path.join(spool, "ids"), "w+b")
  with offsets, tokens, ids, contextlib.ExitStack() as stack:
    offsets.write(np.zeros(1, np.int64).tobytes())
    for chunk in _line_chunks(input_path):
      n += len(chunk)
      if job.per_token:  # Token counts and the widest token string.
        enc = job.tok.encode_batch(chunk)
        lens = np.asarray([len(e.ids) for e in enc], np.int64)
        width = max([width] + [len(t) for e in enc for t in e.tokens])
        offsets.write((m + np.cumsum(lens)).tobytes())
        m += int(lens.sum())
    if not n:
      raise ValueError(f"--input {input_path} is empty: give one sentence "
                       "per line.")
    vec = stack.enter_context(open(paths[0], "wb"))
    vec.write(_npy_header(np.float32, (n, job.hidden)))
    member = None
    if job.per_token:
      zf = stack.enter_context(zipfile.ZipFile(paths[1], "w",
                                               allowZip64=True))
      member = zf.open("vectors.npy", "w", force_zip64=True)
      member.write(_npy_header(np.float32, (m, job.hidden)))
    written = 0
    for chunk in _line_chunks(input_path):
      pooled, per_token = job.chunk(chunk)
      vec.write(np.ascontiguousarray(pooled, np.float32).tobytes())
      for t in per_token or ():
        member.write(np.ascontiguousarray(t.vectors, np.float32).tobytes())
        tokens.write(np.asarray(t.tokens, f"<U{width}").tobytes())
        ids.write(np.asarray(t.ids, np.int32).tobytes())
        written += len(t.ids)
    if member is not None:
      member.close()
      if written != m:
        raise RuntimeError(f"{input_path} changed while it was read "
                           f"({m} tokens counted, {written} embedded).")
      _copy_member(zf, "tokens.npy", f"<U{width}", (m,), tokens)
      _copy_member(zf, "ids.npy", np.int32, (m,), ids)
      _copy_member(zf, "offsets.npy", np.int64, (n + 1,), offsets)
  return n, job.hidden, m


def _line_chunks(path: str):
  """Lists of up to CHUNK_SENTENCES lines of a text file, streamed."""
  check_input(path)
  chunk = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      chunk.append(line.rstrip("\n"))
      if len(chunk) == CHUNK_SENTENCES:
        yield chunk
        chunk = []
  if chunk:
    yield chunk


def save_per_token(path: str, per_token: Sequence[TokenVectors]) -> None:
  """An .npz: vectors [M, H], tokens [M], ids [M], offsets [N+1] (sentence i
  is rows offsets[i]:offsets[i+1])."""
  offsets = np.cumsum([0] + [len(t.tokens) for t in per_token])
  np.savez(path,
           vectors=np.concatenate([t.vectors for t in per_token]),
           tokens=np.asarray([s for t in per_token for s in t.tokens]),
           ids=np.concatenate([t.ids for t in per_token]),
           offsets=offsets.astype(np.int64))


def check_input(path: str) -> None:
  if not os.path.isfile(path):
    raise FileNotFoundError(f"--input {path} does not exist.")


def read_lines(path: str) -> list[str]:
  """One sentence per line; blank lines are kept so line i -> row i."""
  lines = [line for chunk in _line_chunks(path) for line in chunk]
  if not lines:
    raise ValueError(f"--input {path} is empty: give one sentence per line.")
  return lines
