"""Sentence vectors of any model, several sentences packed into each row.

  embedder = sentence_embeddings.load(PATH)       # its own pooling
  vectors = embedder.encode(["a sentence", ...])  # [N, d] float32, in order
  sentence_embeddings.write(embedder, "lines.txt", "vectors.npy")

The model is the encoder a path holds (``compose.bare_encoder``: any
family's, any run's) with the embedding head (``compose.embedding_table``:
pooled tokens, optionally L2-normalised). Its pooling, normalisation and
text length are the model's own when it has them (a sentence-transformers
directory's modules, an embedding run's head: ``model.embedding_pooling``,
``data.seq_length``); the caller's otherwise.

Packing: the sentences of a chunk are tokenized (the ``tokenizers``
library, the files an export ships) and packed into rows of
``row_length`` tokens, at most ``max_sequences`` a row
(``downstream/packed_texts``, as fill-mask's and any layer's vectors); each
token attends only inside its sentence (``sequence_ids``) and
positions restart at each sentence (``position_ids``), so no padding is
computed but a row's tail, and each vector equals the sentence's alone.
Rows go through one compiled step of static shape, batched over every
device. Output files are written as the chunks are embedded: memory is one
chunk's, whatever the number of lines.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_jax import compose
from bert_jax import pretrained
from bert_jax.downstream import embeddings
from bert_jax.downstream import packed_texts
from bert_jax.hf import mapping
from bert_jax.models import heads

CHUNK = 8192  # Sentences packed and embedded together.


@dataclasses.dataclass
class Embedder:
  """A loaded embedding model and how its inputs are cut and packed."""
  model: nnx.Module  # heads.TaskModel of the embed role
  tokenizer: object  # tokenizers.Tokenizer: no padding, cut at max_length
  max_length: int
  pooling: str
  normalize: bool
  row_length: int
  max_sequences: int
  rows_per_step: int
  dimension: int

  def encode(self, sentences: Sequence[str]) -> np.ndarray:
    """[N, d] float32 vectors of `sentences`, in order."""
    parts = [self._chunk(list(sentences[i:i + CHUNK]))
             for i in range(0, len(sentences), CHUNK)]
    return (np.concatenate(parts) if parts else
            np.zeros((0, self.dimension), np.float32))

  def stream(self, sentences: Iterable[str]):
    """[n, d] arrays of the vectors of consecutive chunks of `sentences`."""
    chunk = []
    for s in sentences:
      chunk.append(s)
      if len(chunk) == CHUNK:
        yield self._chunk(chunk)
        chunk = []
    if chunk:
      yield self._chunk(chunk)

  def _chunk(self, sentences: list[str]) -> np.ndarray:
    ids = [e.ids for e in self.tokenizer.encode_batch(sentences)]
    out = np.zeros((len(ids), self.dimension), np.float32)
    for b in packed_texts.batches(
        ids, [[0] * len(x) for x in ids], seq_length=self.row_length,
        max_sequences=self.max_sequences, batch_size=self.rows_per_step,
        max_positions=self.row_length):
      step = _step(self.model, *b["cls_positions"].shape,
                   b["input_ids"].shape[1])
      vectors = np.asarray(step(b["input_ids"], b["sequence_ids"],
                                b["position_ids"], b["cls_positions"]))
      index = b[packed_texts.INDEX]  # [R, S]: each slot's sentence, or -1.
      used = index >= 0
      out[index[used]] = vectors[used]
    return out


@functools.lru_cache(maxsize=8)
def _step(model, rows: int, max_sequences: int, length: int):
  """The jitted forward over [rows, length] packed rows -> [rows, S, d],
  rows spread over every device, params replicated."""
  graphdef, state = nnx.split(model)
  devices = jax.local_devices()  # This process's: a job of one process.
  if rows % len(devices):
    raise ValueError(f"rows_per_step={rows} must be a multiple of the "
                     f"{len(devices)} devices.")
  mesh = Mesh(np.asarray(devices), ("rows",))
  spread = NamedSharding(mesh, PartitionSpec("rows"))
  state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))

  @functools.partial(jax.jit, in_shardings=(spread,) * 4)
  def forward(ids, seq, pos, cls):
    m = nnx.merge(graphdef, state)
    return m(ids, (seq > 0).astype(jnp.int32), jnp.zeros_like(ids),
             sequence_ids=seq, position_ids=pos, cls_positions=cls)

  del rows, length, max_sequences  # (The cache key.)
  return forward


def load(path: str, step: int | None = None, *, pooling: str | None = None,
         normalize: bool | None = None, max_length: int | None = None,
         default_pooling: str = "mean", row_length: int | None = None,
         max_sequences: int = 64, rows_per_step: int | None = None
         ) -> Embedder:
  """The embedding model at `path` (a workdir, step, imported, Hugging
  Face or sentence-transformers directory): `pooling` / `normalize` /
  `max_length` default to the model's own, else `default_pooling`, no
  normalisation and max_position_embeddings. Rows are `row_length`
  tokens (default max_length), `rows_per_step` of them (default 8 per
  device of this process) per compiled step."""
  source = pretrained.resolve(path, step)
  if source.config is None:  # A weights file without config: one error.
    pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source)
  mc, encoder = compose.bare_encoder(source.config, params)
  own = mc.get("embedding_pooling", "") or ""
  pooling = pooling or own or default_pooling
  if pooling not in heads.POOLINGS:
    raise ValueError(f"pooling {pooling!r} must be one of {heads.POOLINGS}.")
  if normalize is None:
    normalize = bool(mc.get("embedding_normalize", False)) if own else False
  limit = int(mc.max_position_embeddings)
  if max_length is None:
    max_length = min(int(source.config.data.seq_length), limit) if own else (
        limit)
  if not 2 <= int(max_length) <= limit:
    raise ValueError(f"max_length={max_length} must be between 2 and the "
                     f"model's max_position_embeddings={limit}.")
  mc.update(embedding_pooling=pooling, embedding_normalize=bool(normalize))
  model = mapping.make_model(
      encoder, mc, compose.embedding_table(compose.family(
          source.config).name))
  row_length = int(row_length or max_length)
  if not int(max_length) <= row_length <= limit:
    raise ValueError(f"row_length={row_length} must hold a whole text "
                     f"(max_length={max_length}) and fit the model's "
                     f"max_position_embeddings={limit}.")
  return Embedder(
      model, embeddings.plain_tokenizer(pretrained.load_tokenizer(source),
                                        int(max_length)),
      int(max_length), pooling, bool(normalize), row_length,
      int(max_sequences), int(rows_per_step or 8 * jax.local_device_count()),
      int(mc.hidden_size))


# -----------------------------------------------------------------------------
# Files: .npy written as the rows come.
# -----------------------------------------------------------------------------
class NpyWriter:
  """A float32 [N, width] .npy file written row block by row block, N
  unknown until :meth:`close`: the header is written for a huge N and
  rewritten, at the same length, with the real one; the file is written
  beside `path` and renamed when complete."""

  _RESERVED = 10**15

  def __init__(self, path: str, width: int):
    self.path, self.width, self.rows = path, int(width), 0
    self.partial = f"{path}.tmp{os.getpid()}"
    self._f = open(self.partial, "wb")
    self._size = len(self._header(self._RESERVED))
    self._f.write(self._header(self._RESERVED))

  def _header(self, rows: int, size: int | None = None) -> bytes:
    d = ("{'descr': '<f4', 'fortran_order': False, 'shape': "
         f"({rows}, {self.width}), }}")
    size = size or -(-(10 + len(d) + 1) // 64) * 64
    return (b"\x93NUMPY\x01\x00" + (size - 10).to_bytes(2, "little") +
            d.encode("latin1").ljust(size - 11) + b"\n")

  def write(self, rows: np.ndarray) -> None:
    self._f.write(np.ascontiguousarray(rows, "<f4").tobytes())
    self.rows += len(rows)

  def close(self) -> None:
    self._f.seek(0)
    self._f.write(self._header(self.rows, self._size))
    self._f.close()
    os.replace(self.partial, self.path)

  def abort(self) -> None:
    self._f.close()
    if os.path.exists(self.partial):
      os.remove(self.partial)


def shard_path(output: str, index: int) -> str:
  """vectors.npy -> vectors-00003.npy."""
  stem, ext = os.path.splitext(output)
  return f"{stem}-{index:05d}{ext or '.npy'}"


def write(embedder: Embedder, input_path: str, output: str,
          shard_rows: int = 0) -> tuple[int, list[str]]:
  """Every line of `input_path` embedded into `output` (.npy [N, d]), or
  with `shard_rows` into shards of that many rows (:func:`shard_path`);
  returns (lines, files). A failure leaves no partial file."""
  embeddings.check_input(input_path)
  files, writer, total = [], None, 0
  try:
    with open(input_path, encoding="utf-8") as f:
      for vectors in embedder.stream(line.rstrip("\n") for line in f):
        while len(vectors):
          if writer is None:
            path = shard_path(output, len(files)) if shard_rows else output
            writer = NpyWriter(path, vectors.shape[1])
          room = shard_rows - writer.rows if shard_rows else len(vectors)
          writer.write(vectors[:room])
          total += min(room, len(vectors))
          vectors = vectors[room:]
          if shard_rows and writer.rows == shard_rows:
            writer.close()
            files.append(writer.path)
            writer = None
    if writer is not None:
      writer.close()
      files.append(writer.path)
      writer = None
  finally:
    if writer is not None:
      writer.abort()
  if not total:
    raise ValueError(f"--input {input_path} is empty: give one sentence "
                     "per line.")
  return total, files
