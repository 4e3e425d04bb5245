"""Batches of precomputed windowed features (token tagging, extractive QA).

Token tagging and QA build their features on the host (words -> sub-tokens
with character offsets, overlapping windows: ``token_features``,
``span_features``); this module windows long sequences and batches the
result the way ``task_data`` batches sentence tasks: each feature falls in
the smallest bucket length that holds it (:func:`bucket_lengths`) and
every batch comes from one bucket, so XLA compiles once per bucket.

* :func:`bucket_lengths`: the static lengths batches may have (sentence
  tasks' too: ``task_data`` batches by the same lengths).
* :func:`window_starts` / :func:`max_context_owner`: google-research/bert's
  doc-stride windows (a window starts every ``stride`` tokens until one
  reaches the end) and its "maximum context" rule (a token belongs to the
  window where it has the most context on its shorter side).
* :class:`FeatureIterator`: endless training batches; each epoch a seeded
  permutation (numpy's legacy ``RandomState``, whose stream numpy keeps
  fixed); the state (epoch, position, part-filled buckets) is a small JSON
  file saved with every checkpoint, so a resumed run continues the same
  stream exactly (:func:`save_state` / :func:`load_state`, shared with
  ``feature_packing``'s packed rows and ``pair_batches``' pairs, as are
  :func:`host_slice` and :class:`HostShareIterator`). No TensorFlow
  constant holds the features.
* :func:`eval_batches`: every feature once, in order within its bucket; the
  last batch of a bucket is filled with rows of weight 0 and
  ``example_index`` -1 (``example_index`` is the feature's row).

Multi-host: every process builds the same features and batches and keeps its
slice of each GLOBAL batch (as ``task_data``, for the same reason).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

import numpy as np

DEFAULT_BUCKETS = (32, 64, 128)
INDEX = "example_index"
STATE_FILE = "feature_iterator.json"


def bucket_lengths(seq_length: int,
                   buckets: Sequence[int] = DEFAULT_BUCKETS) -> tuple[int, ...]:
  """The static sequence lengths batches may have (sorted, last seq_length)."""
  if seq_length < 3:
    raise ValueError(f"seq_length={seq_length} must be >= 3 ([CLS] x [SEP]).")
  return tuple(sorted({min(int(b), seq_length) for b in buckets if int(b) > 2}
                      | {int(seq_length)}))


def window_starts(n: int, window: int, stride: int) -> list[int]:
  """Starts of windows of `window` tokens over `n` tokens, every `stride`
  tokens until a window reaches the end (google-research/bert's doc
  spans); one window when the sequence fits."""
  if window < 1 or stride < 1:
    raise ValueError(f"window={window} and stride={stride} must be >= 1.")
  starts = [0]
  while starts[-1] + window < n:
    starts.append(starts[-1] + min(window, stride))
  return starts


def max_context_owner(position: int, starts: Sequence[int],
                      lengths: Sequence[int]) -> int:
  """The window (index) in which `position` has the most context: the
  largest min(left, right) + 0.01 * window length; the first on ties."""
  best, best_score = -1, -1.0
  for k, (s, n) in enumerate(zip(starts, lengths)):
    if s <= position < s + n:
      score = min(position - s, s + n - 1 - position) + 0.01 * n
      if score > best_score:
        best, best_score = k, score
  return best


@dataclasses.dataclass
class Features:
  """Model features of N windows, padded to seq_length.

  ``arrays``: {name: [N, seq_length] per-position or [N] per-window array};
  ``lengths`` counts the real tokens (specials included); positions from
  ``segment_start`` on are segment 1 (QA's context), none when it is None.
  """
  input_ids: np.ndarray  # [N, T] int32
  lengths: np.ndarray  # [N] int32
  arrays: dict
  segment_start: Optional[np.ndarray] = None  # [N] int32

  def __len__(self):
    return len(self.lengths)

  @property
  def seq_length(self) -> int:
    return int(self.input_ids.shape[1])

  def rows(self, idx: np.ndarray, length: int, pad_id: int) -> dict:
    """Rows `idx` cut to `length` positions, with mask and segments."""
    ids = self.input_ids[idx, :length]
    n = self.lengths[idx][:, None]
    pos = np.arange(length)[None]
    mask = pos < n
    seg = (np.zeros_like(mask) if self.segment_start is None else
           (pos >= self.segment_start[idx][:, None]) & mask)
    out = dict(input_ids=np.where(mask, ids, pad_id).astype(np.int32),
               input_mask=mask.astype(np.int32),
               segment_ids=seg.astype(np.int32))
    for k, v in self.arrays.items():
      out[k] = v[idx, :length] if v.ndim == 2 else v[idx]
    return out


def _bucket_of(features: Features, lengths: Sequence[int]) -> np.ndarray:
  return np.searchsorted(np.asarray(lengths), features.lengths, side="left")


def _pad_rows(batch: dict, size: int) -> dict:
  """Fill a short batch to `size` rows of zeros (weights 0, index -1)."""
  n = len(batch["input_ids"])
  if n == size:
    return batch
  out = {}
  for k, v in batch.items():
    fill = -1 if k == INDEX else 0
    pad = np.full((size - n,) + v.shape[1:], fill, v.dtype)
    out[k] = np.concatenate([v, pad])
  return out


def host_slice(batch: dict, process_index: int, process_count: int) -> dict:
  """This process's rows of a global batch."""
  per = len(batch["input_ids"]) // process_count
  return {k: v[process_index * per:(process_index + 1) * per]
          for k, v in batch.items()}


def check_split(batch_size: int, process_count: int) -> None:
  if batch_size % process_count:
    raise ValueError(f"batch_size={batch_size} is not divisible by the "
                     f"process count {process_count}.")


def epoch_permutation(seed: int, epoch: int, n: int) -> np.ndarray:
  """The order an epoch visits `n` features: numpy's legacy RandomState
  (whose stream numpy keeps fixed) seeded by (seed, epoch)."""
  rs = np.random.RandomState([int(seed) & 0xFFFFFFFF, epoch, 0x7A5C])
  return rs.permutation(n)


def save_state(directory: str, process_index: int, state: dict,
               file_name: str = STATE_FILE) -> str:
  """A training iterator's JSON state, in directory/process_<i>/
  (`file_name`: each kind of iterator keeps its own file, so a checkpoint
  of one is never read as the other's)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  d = os.path.join(directory, f"process_{process_index}")
  tf.io.gfile.makedirs(d)
  path = os.path.join(d, file_name)
  with tf.io.gfile.GFile(path, "w") as f:
    json.dump(state, f)
  return path


def load_state(directory: str, process_index: int, mine: dict,
               keys: Sequence[str], file_name: str = STATE_FILE) -> dict:
  """The state :func:`save_state` wrote, refused when one of `keys`
  differs from this iterator's (`mine`): another task, seed or batch
  shape (a state written without the key, by the other layout, shows as
  None)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, f"process_{process_index}", file_name)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"No training-iterator state at {path}.")
  with tf.io.gfile.GFile(path) as f:
    state = json.load(f)
  for key in keys:
    if state.get(key) != mine[key]:
      raise ValueError(
          f"The checkpoint's data position is for {key}={state.get(key)}, "
          f"this run has {mine[key]}: resume with the same task data, "
          "seed, batch_size, seq_length, buckets and data.packing, or use "
          "a fresh workdir.")
  return state


class HostShareIterator:
  """The trainer's count of a training iterator that hands this host its
  share of every global batch: each batch it counted (``_batches``) was
  ``batch_size`` examples over ``process_count`` hosts."""

  @property
  def examples_consumed(self) -> int:
    return self._batches * self.batch_size // self.process_count


class FeatureIterator(HostShareIterator):
  """Endless shuffled training batches of this host's share of batch_size.

  Every epoch visits each feature once in a permutation drawn from (seed,
  epoch); a batch never mixes buckets and is always full (a bucket's
  leftovers wait for the next epoch's rows). ``save``/``restore`` keep the
  exact position.
  """

  def __init__(self, features: Features, *, batch_size: int, seed: int,
               lengths: Sequence[int], pad_id: int = 0,
               process_index: int = 0, process_count: int = 1):
    if not len(features):
      raise ValueError("The training split has no usable rows.")
    check_split(batch_size, process_count)
    self.features, self.batch_size, self.seed = features, batch_size, seed
    self.lengths = tuple(int(x) for x in lengths)
    self.pad_id, self.process_index = pad_id, process_index
    self.process_count = process_count
    self._bucket = _bucket_of(features, self.lengths)
    self.stats: dict = {}
    self._reset()

  def _reset(self):
    self._epoch, self._pos, self._batches = 0, 0, 0
    self._pending = [[] for _ in self.lengths]
    self._order = self._permutation(0)

  def _permutation(self, epoch: int) -> np.ndarray:
    return epoch_permutation(self.seed, epoch, len(self.features))

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    while True:
      if self._pos == len(self._order):
        self._epoch, self._pos = self._epoch + 1, 0
        self._order = self._permutation(self._epoch)
      i = int(self._order[self._pos])
      self._pos += 1
      b = int(self._bucket[i])
      self._pending[b].append(i)
      if len(self._pending[b]) == self.batch_size:
        idx = np.asarray(self._pending[b])
        self._pending[b] = []
        self._batches += 1
        batch = self.features.rows(idx, self.lengths[b], self.pad_id)
        return host_slice(batch, self.process_index, self.process_count)

  def _state(self) -> dict:
    return dict(epoch=self._epoch, position=self._pos,
                batches=self._batches, pending=self._pending,
                num_features=len(self.features), seed=int(self.seed),
                batch_size=self.batch_size, lengths=list(self.lengths))

  def save(self, directory: str) -> str:
    return save_state(directory, self.process_index, self._state())

  def restore(self, directory: str) -> None:
    state = load_state(directory, self.process_index, self._state(),
                       ("num_features", "seed", "batch_size", "lengths"))
    self._epoch, self._pos = int(state["epoch"]), int(state["position"])
    self._batches = int(state["batches"])
    self._pending = [list(map(int, p)) for p in state["pending"]]
    self._order = self._permutation(self._epoch)


def eval_batches(features: Features, *, batch_size: int,
                 lengths: Sequence[int], pad_id: int = 0,
                 process_index: int = 0, process_count: int = 1
                 ) -> list[dict]:
  """Every feature once, with ``example_index`` and ``example_weights``."""
  check_split(batch_size, process_count)
  bucket = _bucket_of(features, lengths)
  out = []
  for b, length in enumerate(lengths):
    rows = np.flatnonzero(bucket == b)
    for lo in range(0, len(rows), batch_size):
      idx = rows[lo:lo + batch_size]
      batch = features.rows(idx, int(length), pad_id)
      batch["example_weights"] = np.ones([len(idx)], np.float32)
      batch[INDEX] = idx.astype(np.int32)
      out.append(host_slice(_pad_rows(batch, batch_size), process_index,
                             process_count))
  return out
