"""Packed rows of precomputed features, on the host (numpy, no TensorFlow).

Token tagging builds its windows on the host (``token_features``); packing
them is cheaper here than in a tf.data graph. The rule is
``packing.py``'s: a window of ``data.packing_window`` features (after the
epoch's shuffle) is bin-packed into rows of ``seq_length`` slots by
best-fit decreasing (longest first, ties in stream order; each goes to the
open row it leaves with the least room, the first such row on ties, or
opens a new row), at most ``data.packing_max_sequences`` (S) a row.

A packed row (``features.PACKING``): the features one after another, each
with its own ``[CLS]``; ``sequence_ids`` 1..k (0 at padding),
``position_ids`` restarting at 0, ``segment_ids`` as each feature had them,
``cls_positions`` [S] where each starts (0 in an empty slot). Per-position
arrays (labels, label weights) move with their tokens; per-feature arrays
become [S] (0 in an empty slot); ``example_weights`` [S] is 1.0 in occupied
slots and ``example_index`` [S] the feature's row (-1 when empty).

* :func:`best_fit_decreasing`: the rows of a window, as feature indices.
* :func:`pack`: rows of features -> one packed batch.
* :class:`PackedFeatureIterator`: endless training batches; each epoch a
  seeded permutation (as ``feature_batches.FeatureIterator``) packed window
  by window, each window's rows in a seeded random order; the rows a batch
  did not take wait for the next. The state (epoch, position, the packed
  rows not yet fed) is a small JSON file saved with every checkpoint, so a
  resumed run continues the same stream exactly.
* :func:`eval_batches`: every feature once, in one slot of one row; the last
  batch is filled with empty rows.

Multi-host: every process packs the same rows and keeps its slice of each
GLOBAL batch (as ``feature_batches``).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from bert_jax.data import feature_batches

INDEX = feature_batches.INDEX
WEIGHTS = "example_weights"
_SALT = 0x9AC7


@dataclasses.dataclass(frozen=True)
class Shape:
  """A packed row's shape: `seq_length` slots, at most `max_sequences`
  features; `window` features are packed together."""
  seq_length: int
  max_sequences: int
  window: int

  @classmethod
  def from_config(cls, data) -> "Shape":
    return cls(seq_length=int(data.seq_length),
               max_sequences=int(data.packing_max_sequences),
               window=int(data.packing_window))


def best_fit_decreasing(lengths: Sequence[int], capacity: int,
                        max_sequences: int) -> list[list[int]]:
  """Rows of indices into `lengths`, in the order rows were opened; each
  row's indices in the order they were placed (its slots)."""
  lengths = np.asarray(lengths, np.int64)
  if len(lengths) and int(lengths.max()) > capacity:
    raise ValueError(f"A feature of {int(lengths.max())} tokens does not fit "
                     f"a row of {capacity}.")
  order = np.argsort(-lengths, kind="stable")
  room = np.zeros(len(lengths), np.int64)  # Per open row: free slots.
  count = np.zeros(len(lengths), np.int64)
  rows: list[list[int]] = []
  for e in order:
    n = int(lengths[e])
    k = len(rows)
    fits = (room[:k] >= n) & (count[:k] < max_sequences)
    if fits.any():
      r = int(np.argmin(np.where(fits, room[:k], capacity + 1)))
    else:
      r = k
      rows.append([])
      room[r] = capacity
    rows[r].append(int(e))
    room[r] -= n
    count[r] += 1
  return rows


def pack(features: feature_batches.Features, rows: Sequence[Sequence[int]],
         shape: Shape, pad_id: int, num_rows: int | None = None) -> dict:
  """`rows` (feature indices per row, in slot order) as one packed batch of
  `num_rows` rows (default len(rows); the rest empty)."""
  t, s = shape.seq_length, shape.max_sequences
  b = len(rows) if num_rows is None else int(num_rows)
  row = np.repeat(np.arange(len(rows)), [len(r) for r in rows])
  slot = np.concatenate([np.arange(len(r)) for r in rows] or [[]]).astype(
      np.int64)
  idx = np.concatenate([np.asarray(r, np.int64) for r in rows] or [[]]
                       ).astype(np.int64)
  if len(rows) > b or any(len(r) > s for r in rows):
    raise ValueError(f"{len(rows)} rows of up to {max(map(len, rows))} "
                     f"features do not fit a batch of {b} x {s}.")
  lengths = features.lengths[idx].astype(np.int64)
  # Each feature's start in its row: the lengths before it in the row.
  ends = np.cumsum(lengths)
  row_first = np.searchsorted(row, row, side="left")
  before = np.concatenate([[0], ends])[row_first]
  offset = ends - lengths - before
  if len(idx) and int((offset + lengths).max()) > t:
    raise ValueError(f"A packed row holds more than {t} tokens.")
  # Token placement: feature idx[j]'s position p goes to (row[j], offset+p).
  tok_of = np.repeat(np.arange(len(idx)), lengths)
  pos = np.arange(int(lengths.sum())) - np.repeat(ends - lengths, lengths)
  at = (row[tok_of], offset[tok_of] + pos)
  src = (idx[tok_of], pos)
  out = dict(input_ids=np.full((b, t), pad_id, np.int32),
             input_mask=np.zeros((b, t), np.int32),
             segment_ids=np.zeros((b, t), np.int32),
             sequence_ids=np.zeros((b, t), np.int32),
             position_ids=np.zeros((b, t), np.int32),
             cls_positions=np.zeros((b, s), np.int32))
  out["input_ids"][at] = features.input_ids[src]
  out["input_mask"][at] = 1
  if features.segment_start is not None:
    out["segment_ids"][at] = pos >= features.segment_start[src[0]]
  out["sequence_ids"][at] = slot[tok_of] + 1
  out["position_ids"][at] = pos
  out["cls_positions"][row, slot] = offset
  for k, v in features.arrays.items():
    if v.ndim == 2:
      out[k] = np.zeros((b, t), v.dtype)
      out[k][at] = v[src]
    else:
      out[k] = np.zeros((b, s), v.dtype)
      out[k][row, slot] = v[idx]
  out[WEIGHTS] = np.zeros((b, s), np.float32)
  out[WEIGHTS][row, slot] = 1.0
  out[INDEX] = np.full((b, s), -1, np.int32)
  out[INDEX][row, slot] = idx
  return out


def _window_rows(features, idx: np.ndarray, shape: Shape) -> list[list[int]]:
  """The packed rows of the features `idx` (one window), as feature ids."""
  rows = best_fit_decreasing(features.lengths[idx], shape.seq_length,
                             shape.max_sequences)
  return [[int(idx[j]) for j in r] for r in rows]


def rows_per_epoch(features: feature_batches.Features, shape: Shape) -> int:
  """How many packed rows one pass over the features fills (in reading
  order; a shuffled epoch packs within a row or two of it a window): what
  an epoch of packed training is, in rows."""
  n = len(features)
  return sum(len(_window_rows(features, np.arange(lo, min(lo + shape.window,
                                                          n)), shape))
             for lo in range(0, n, shape.window))


class PackedFeatureIterator(feature_batches.HostShareIterator):
  """Endless packed training batches of this host's share of batch_size
  rows. Every epoch visits each feature once (a permutation drawn from
  (seed, epoch)); ``save``/``restore`` keep the exact position."""

  def __init__(self, features: feature_batches.Features, *, batch_size: int,
               seed: int, shape: Shape, pad_id: int = 0,
               process_index: int = 0, process_count: int = 1):
    if not len(features):
      raise ValueError("The training split has no usable rows.")
    feature_batches.check_split(batch_size, process_count)
    self.features, self.batch_size, self.seed = features, batch_size, seed
    self.shape, self.pad_id = shape, pad_id
    self.process_index, self.process_count = process_index, process_count
    self.stats: dict = {}
    self._epoch, self._pos, self._window, self._batches = 0, 0, 0, 0
    self._pending: list[list[int]] = []  # Packed rows not yet fed.
    self._order = self._permutation(0)

  def _permutation(self, epoch: int) -> np.ndarray:
    return feature_batches.epoch_permutation(self.seed, epoch,
                                             len(self.features))

  def _pack_next_window(self) -> None:
    if self._pos == len(self._order):
      self._epoch, self._pos, self._window = self._epoch + 1, 0, 0
      self._order = self._permutation(self._epoch)
    idx = self._order[self._pos:self._pos + self.shape.window]
    rows = _window_rows(self.features, idx, self.shape)
    rs = np.random.RandomState([int(self.seed) & 0xFFFFFFFF, self._epoch,
                                self._window, _SALT])
    self._pending += [rows[i] for i in rs.permutation(len(rows))]
    self._pos += len(idx)
    self._window += 1

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    while len(self._pending) < self.batch_size:
      self._pack_next_window()
    rows = self._pending[:self.batch_size]
    self._pending = self._pending[self.batch_size:]
    self._batches += 1
    batch = pack(self.features, rows, self.shape, self.pad_id)
    del batch[INDEX]  # Training batches hold the model's features only.
    return feature_batches.host_slice(batch, self.process_index,
                                      self.process_count)

  def _state(self) -> dict:
    return dict(epoch=self._epoch, position=self._pos, window=self._window,
                batches=self._batches, pending=self._pending,
                num_features=len(self.features), seed=int(self.seed),
                batch_size=self.batch_size,
                packing=dataclasses.asdict(self.shape))

  def save(self, directory: str) -> str:
    return feature_batches.save_state(directory, self.process_index,
                                      self._state())

  def restore(self, directory: str) -> None:
    state = feature_batches.load_state(
        directory, self.process_index, self._state(),
        ("num_features", "seed", "batch_size", "packing"))
    self._epoch, self._pos = int(state["epoch"]), int(state["position"])
    self._window, self._batches = int(state["window"]), int(state["batches"])
    self._pending = [list(map(int, r)) for r in state["pending"]]
    self._order = self._permutation(self._epoch)


def eval_batches(features: feature_batches.Features, *, batch_size: int,
                 shape: Shape, pad_id: int = 0, process_index: int = 0,
                 process_count: int = 1) -> list[dict]:
  """Every feature once (windows in reading order, rows in packing order),
  with ``example_index`` and ``example_weights`` [B, S]; the last batch is
  filled with empty rows."""
  feature_batches.check_split(batch_size, process_count)
  n = len(features)
  rows = [r for lo in range(0, n, shape.window)
          for r in _window_rows(features, np.arange(lo, min(lo + shape.window,
                                                            n)), shape)]
  return [feature_batches.host_slice(
      pack(features, rows[lo:lo + batch_size], shape, pad_id, batch_size),
      process_index, process_count)
          for lo in range(0, len(rows), batch_size)]
