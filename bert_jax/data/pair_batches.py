"""Batches of sentence pairs (and triplets, ...) for a bi-encoder.

Each text is encoded alone, ``[CLS] pieces [SEP]`` cut to ``seq_length``,
once per distinct text of a split (:class:`Texts`). A batch row is one
example: its K texts (anchor, positive, hard negatives; or sentence1,
sentence2) as ``[B, K, L]`` arrays (``features.pair_spec``), each text
padded to the batch's length L, the smallest bucket
(``feature_batches.bucket_lengths``) that holds its longest text, so XLA
compiles once per bucket. ``text_ids`` [B, K] names each slot's distinct
text (-1: empty), which is how the loss tells a duplicate text from a
negative; ``scores`` [B] is the pair's gold score (0 without one).

* :class:`PairIterator`: endless training batches in a seeded permutation
  per epoch (numpy's ``RandomState``, a fixed stream); its state (epoch,
  position) is a small JSON file saved with each checkpoint, so a resumed
  run continues the same stream exactly.
* :func:`eval_pairs` / :func:`eval_texts`: every pair (or every text, two
  to a row, for retrieval) once, sorted by length; ``example_index`` [B, K]
  is each slot's text in the split (-1: empty), ``example_weights`` 0 on
  rows that are no training example (padding rows, and text lists).
* :func:`pack` (``data.packing``): a batch's B x K texts bin-packed into B
  rows (``features.packed_pair_spec``), each text attending to itself only,
  with its own positions; ``slots`` [B, K] says where each slot's text sits
  (row * S + its place in the row), so the step gathers the same [B, K, d]
  vectors it pools from padded texts, without computing their padding. For
  the cached-gradient step each chunk of examples is packed into its own
  rows, so a chunk embeds alone.

Multi-host: every process builds the same global batches and keeps its
slice, as ``feature_batches``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from bert_jax.data import feature_batches
from bert_jax.data import feature_packing

INDEX = feature_batches.INDEX
STATE_FILE = "pair_iterator.json"


@dataclasses.dataclass
class Texts:
  """The distinct texts of a split, encoded: `ids[i]` is text i's
  ``[CLS] ... [SEP]`` ids."""
  strings: list[str]
  ids: list[np.ndarray]

  def __len__(self):
    return len(self.strings)

  @property
  def lengths(self) -> np.ndarray:
    return np.asarray([len(x) for x in self.ids], np.int64)


def distinct(columns: Sequence[np.ndarray]) -> tuple[list[str], np.ndarray]:
  """(distinct texts in first-seen order, [N, K] index of each cell)."""
  where: dict[str, int] = {}
  index = np.zeros((len(columns[0]), len(columns)), np.int32)
  for k, col in enumerate(columns):
    for n, text in enumerate(col):
      index[n, k] = where.setdefault(str(text), len(where))
  return list(where), index


def encode_texts(strings: Sequence[str], encode: Callable, cls_id: int,
                 sep_id: int, seq_length: int) -> Texts:
  """`encode(list of str) -> list of piece-id arrays` (no specials), each
  wrapped as ``[CLS] pieces [SEP]`` and cut to `seq_length` tokens."""
  if seq_length < 3:
    raise ValueError(f"data.seq_length={seq_length} must be >= 3.")
  pieces = encode(list(strings))
  keep = seq_length - 2
  ids = [np.concatenate([[cls_id], np.asarray(p[:keep], np.int32),
                         [sep_id]]).astype(np.int32) for p in pieces]
  return Texts(list(strings), ids)


def bucket_for(lengths: np.ndarray, buckets: Sequence[int]) -> int:
  """The smallest bucket holding the longest of `lengths`."""
  longest = int(np.max(lengths)) if len(lengths) else 1
  return next(b for b in buckets if b >= longest)


def rows(texts: Texts, index: np.ndarray, length: int, pad_id: int = 0
         ) -> dict:
  """input_ids / input_mask / segment_ids [n, K, length] and text_ids
  [n, K] of the texts `index` [n, K] names (-1: an empty slot)."""
  n, k = index.shape
  ids = np.full((n, k, length), pad_id, np.int32)
  mask = np.zeros((n, k, length), np.int32)
  for (r, c), t in np.ndenumerate(index):
    if t >= 0:
      x = texts.ids[t][:length]
      ids[r, c, :len(x)] = x
      mask[r, c, :len(x)] = 1
  return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids),
              text_ids=index.astype(np.int32))


@dataclasses.dataclass(frozen=True)
class Packing:
  """Packed rows of a pairs batch: their length is the first of
  `row_lengths` whose rows hold the batch (``row_lengths_for``), with at
  most `max_sequences` texts a row. With `chunks` = k > 1 (the cached-
  gradient step's chunks: rows c, c + k, c + 2k, ...), each chunk's texts
  are packed into the chunk's own rows."""
  row_lengths: tuple
  max_sequences: int
  chunks: int = 1


def row_lengths_for(lengths: Sequence[int], texts: int) -> tuple:
  """Row lengths to try: the buckets, then `texts` x the longest bucket,
  where every example's texts fit one row of their own (so B rows always
  hold a batch of B examples)."""
  lengths = tuple(sorted(int(x) for x in lengths))
  last = texts * lengths[-1]
  return lengths + ((last,) if last > lengths[-1] else ())


def _rows_of(sizes: np.ndarray, packing: Packing, num_rows: int
             ) -> tuple[int, list]:
  """(row length, per chunk its rows of text indices): the shortest
  length at which every chunk's texts fit its `num_rows` rows."""
  longest = int(sizes.max()) if sizes.size else 1
  for t in packing.row_lengths:
    if t < longest:
      continue
    rows = [feature_packing.best_fit_decreasing(
        c[c > 0], t, packing.max_sequences) for c in sizes]
    if all(len(r) <= num_rows for r in rows):
      return t, rows
  raise ValueError(f"{sizes.size} texts of up to {longest} tokens do not "
                   f"fit rows of {packing.row_lengths[-1]}.")


def pack(batch: dict, packing: Packing, pad_id: int = 0) -> dict:
  """`batch` (:func:`rows`' [B, K, L] texts) with its texts packed into B
  rows of the shortest of ``packing.row_lengths`` that holds them all
  (best-fit decreasing, ``feature_packing``), chunk by chunk; the other
  arrays unchanged. ``slots`` [B, K] is each text's place among its
  chunk's rows: row within the chunk * S + place (-1: an empty slot)."""
  ids, mask = batch["input_ids"], batch["input_mask"]
  b, k, length = ids.shape
  s, n = int(packing.max_sequences), int(packing.chunks)
  if b % n:
    raise ValueError(f"{b} examples do not make {n} equal chunks.")
  # Chunk c: examples (and rows) c, c + n, ...; its texts in example order.
  sizes = mask.sum(-1).astype(np.int32)  # [B, K]
  chunk_sizes = np.stack([sizes[c::n].reshape(-1) for c in range(n)])
  t, chunk_rows = _rows_of(chunk_sizes, packing, b // n)
  out = {name: np.zeros((b, t), np.int32) for name in
         ("input_ids", "input_mask", "segment_ids", "sequence_ids",
          "position_ids")}
  out["input_ids"][:] = pad_id
  out["cls_positions"] = np.zeros((b, s), np.int32)
  slots = np.full((b, k), -1, np.int32)
  for c, rows in enumerate(chunk_rows):
    texts = ids[c::n].reshape(-1, length)
    present = np.flatnonzero(chunk_sizes[c] > 0)
    features = feature_batches.Features(texts[present],
                                        chunk_sizes[c][present], {})
    got = feature_packing.pack(features, rows,
                               feature_packing.Shape(t, s, 0), pad_id,
                               num_rows=b // n)
    for name in out:
      out[name][c::n] = got[name]
    where = got[INDEX]  # [B / n, S]: each place's text among `present`.
    r, j = np.nonzero(where >= 0)
    chunk_slots = slots[c::n].reshape(-1)
    chunk_slots[present[where[r, j]]] = r * s + j
    slots[c::n] = chunk_slots.reshape(-1, k)
  rest = {name: v for name, v in batch.items()
          if name not in ("input_ids", "input_mask", "segment_ids")}
  return dict(rest, **out, slots=slots)


class PairIterator(feature_batches.HostShareIterator):
  """Endless shuffled training batches (this host's share of batch_size):
  each epoch visits every example once, in a permutation drawn from (seed,
  epoch); a batch that would cross an epoch ends it and the next starts
  afresh, so every batch is full. ``save``/``restore`` keep the position."""

  def __init__(self, texts: Texts, index: np.ndarray, scores: np.ndarray,
               *, batch_size: int, seed: int, lengths: Sequence[int],
               pad_id: int = 0, process_index: int = 0,
               process_count: int = 1, packing: Packing | None = None):
    feature_batches.check_split(batch_size, process_count)
    if len(index) < batch_size:
      raise ValueError(f"train.batch_size={batch_size} is larger than the "
                       f"{len(index)} training examples.")
    self.texts, self.index, self.scores = texts, index, scores
    self.batch_size, self.seed = int(batch_size), int(seed)
    self.lengths = tuple(int(x) for x in lengths)
    self.pad_id, self.process_index = pad_id, process_index
    self.process_count, self.packing = process_count, packing
    self.stats: dict = {}
    self._epoch, self._pos, self._batches = 0, 0, 0
    self._order = self._permutation(0)

  def _permutation(self, epoch: int) -> np.ndarray:
    rs = np.random.RandomState([self.seed & 0xFFFFFFFF, epoch, 0x9A1E])
    return rs.permutation(len(self.index))

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self._pos + self.batch_size > len(self._order):
      self._epoch, self._pos = self._epoch + 1, 0
      self._order = self._permutation(self._epoch)
    idx = self._order[self._pos:self._pos + self.batch_size]
    self._pos += self.batch_size
    self._batches += 1
    chosen = self.index[idx]
    length = bucket_for(self.texts.lengths[chosen.reshape(-1)],
                        self.lengths)
    batch = rows(self.texts, chosen, length, self.pad_id)
    batch.update(scores=self.scores[idx].astype(np.float32),
                 example_weights=np.ones(len(idx), np.float32))
    if self.packing is not None:
      batch = pack(batch, self.packing, self.pad_id)
    return feature_batches.host_slice(batch, self.process_index,
                                      self.process_count)

  def _state(self) -> dict:
    return dict(epoch=self._epoch, position=self._pos, batches=self._batches,
                num_examples=len(self.index), seed=self.seed,
                batch_size=self.batch_size, lengths=list(self.lengths))

  def save(self, directory: str) -> str:
    return feature_batches.save_state(directory, self.process_index,
                                      self._state(), STATE_FILE)

  def restore(self, directory: str) -> None:
    state = feature_batches.load_state(
        directory, self.process_index, self._state(),
        ("num_examples", "seed", "batch_size", "lengths"), STATE_FILE)
    self._epoch, self._pos = int(state["epoch"]), int(state["position"])
    self._batches = int(state["batches"])
    self._order = self._permutation(self._epoch)


def _eval_batches(texts: Texts, index: np.ndarray, scores: np.ndarray,
                  weights: np.ndarray, *, batch_size: int,
                  lengths: Sequence[int], pad_id: int, process_index: int,
                  process_count: int, packing: Packing | None = None
                  ) -> list[dict]:
  feature_batches.check_split(batch_size, process_count)
  longest = np.max(np.where(index >= 0, texts.lengths[np.maximum(index, 0)],
                            0), axis=1)
  order = np.argsort(longest, kind="stable")
  out = []
  for lo in range(0, len(order), batch_size):
    idx = order[lo:lo + batch_size]
    fill = batch_size - len(idx)
    chosen = np.concatenate([index[idx], np.full((fill, index.shape[1]), -1,
                                                 np.int32)])
    length = bucket_for(texts.lengths[index[idx][index[idx] >= 0]], lengths)
    batch = rows(texts, chosen, length, pad_id)
    batch.update(scores=np.r_[scores[idx], np.zeros(fill)].astype(np.float32),
                 example_weights=np.r_[weights[idx],
                                       np.zeros(fill)].astype(np.float32))
    batch[INDEX] = chosen.astype(np.int32)
    if packing is not None:
      batch = pack(batch, packing, pad_id)
    out.append(feature_batches.host_slice(batch, process_index,
                                          process_count))
  return out


def eval_pairs(texts: Texts, index: np.ndarray, scores: np.ndarray,
               weights: np.ndarray, **kw) -> list[dict]:
  """Every example (row of `index` [N, K]) once; `weights` [N] is 1 where
  the row takes part in the eval loss."""
  return _eval_batches(texts, index, scores, weights, **kw)


def eval_texts(texts: Texts, **kw) -> list[dict]:
  """Every text once, two to a row (neighbours in length), weight 0: the
  vectors of a text list (retrieval's queries and documents)."""
  order = np.argsort(texts.lengths, kind="stable").astype(np.int32)
  if len(order) % 2:
    order = np.r_[order, -1].astype(np.int32)
  index = order.reshape(-1, 2)
  n = len(index)
  return _eval_batches(texts, index, np.zeros(n), np.zeros(n), **kw)
