"""The training-data iterator: per-host numpy batches with a saveable state.

The whole pipeline is one tf.data graph with stateless random ops, so its
iterator state (shuffle buffers included) is a TF checkpoint; saving it with
each model checkpoint makes a resumed run see exactly the batches the
uninterrupted run would have. Per-block data counters (``examples.STATS``)
ride along in the batches; the iterator strips, sums, logs and saves them,
with the examples each source gave when several are mixed
(``examples:NAME``: the mixture as trained on).

A saved state only fits a pipeline of the same batch shapes. When a run is
resumed with another batch size or sequence length (other hardware), or a
run enters its next phase (BERT's 128 -> 512, `training/phases.py`), the data
position is carried over as the number of examples this host consumed: the
new pipeline (same seed, same source order) skips ceil(examples / new batch
size) batches and goes on from there. The skip is saved with the state, so
the skipped pipeline resumes exactly too.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import tensorflow as tf
from absl import logging

from bert_jax.data import examples

SOURCE_PREFIX = "examples:"  # Counters of the examples each source gave.


class DataIterator:
  """Iterator of per-host numpy batches whose exact state can be saved."""

  def __init__(self, ds: tf.data.Dataset, process_index: int = 0,
               source_names=()):
    self._ds = ds
    self._it = iter(ds)
    self._ckpt = tf.train.Checkpoint(iterator=self._it)
    self.process_index = process_index
    # The counters' columns: examples.STATS, then one per source mixed.
    self._keys = list(examples.STATS) + [f"{SOURCE_PREFIX}{n}"
                                         for n in source_names]
    self.stats = {k: 0 for k in self._keys}
    self._batches = 0
    self._examples = 0  # Rows this host consumed (batches may vary in size).
    self._skipped = 0  # Batches of `ds` skipped to continue another pipeline.
    self._logged_bad = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._it)
    out = {k: v.numpy() for k, v in batch.items()}
    st = out.pop(examples.STATS_KEY, None)
    self._examples += len(next(iter(out.values())))
    self._batches += 1
    if st is not None:
      for k, v in zip(self._keys, st.tolist()):
        self.stats[k] += int(v)
      b = self._batches
      if b in (1, 10, 100) or b % 1000 == 0:
        logging.info("Data (process %d) so far: %s", self.process_index,
                     ", ".join(f"{k}={v}" for k, v in self.stats.items()))
        self._check_health()
    return out

  # Lines the pipeline had to repair or skip, warned about above this share.
  BAD_LINE_FRACTION = 0.01
  sources = "the training data"  # What the warning names (set by the maker).

  def _check_health(self) -> None:
    """Warns once when invalid, cut or blank lines exceed 1% of lines read."""
    lines = self.stats["lines"]
    bad = {k: self.stats[k] for k in
           ("invalid_utf8_lines", "long_lines", "blank_lines")}
    if self._logged_bad or not lines or (
        max(bad.values()) <= self.BAD_LINE_FRACTION * lines):
      return
    self._logged_bad = 1
    logging.warning(
        "Data (process %d): of %d lines read from %s, %s; those lines are "
        "trained on repaired (U+FFFD), cut to data.max_line_bytes or skipped. "
        "Check the files are UTF-8 text, one sentence per line.",
        self.process_index, lines, self.sources,
        ", ".join(f"{v} ({100 * v / lines:.1f}%) {k.replace('_lines', '')}"
                  for k, v in bad.items() if v))

  def _path(self, directory: str) -> str:
    return os.path.join(directory, f"process_{self.process_index}")

  def shapes(self) -> dict[str, list]:
    """Per-host batch shapes of this pipeline, {feature: shape}."""
    return {k: v.shape.as_list() for k, v in self._ds.element_spec.items()
            if k != examples.STATS_KEY}

  def batch_size(self) -> int | None:
    """Rows per batch, or None when batches vary (bucketed fine-tuning)."""
    size = next(iter(self.shapes().values()))[0]
    return None if size is None else int(size)

  def save(self, directory: str) -> str:
    """Writes the iterator state under directory/process_<i>/."""
    d = self._path(directory)
    tf.io.gfile.makedirs(d)
    path = self._ckpt.write(os.path.join(d, "iterator"))
    with tf.io.gfile.GFile(os.path.join(d, "stats.json"), "w") as f:
      json.dump(dict(self.stats, batches=self._batches,
                     examples_consumed=self._examples,
                     skipped_batches=self._skipped,
                     shapes=self.shapes()), f)
    return path

  def restore(self, directory: str) -> None:
    d = self._path(directory)
    prefix = os.path.join(d, "iterator")
    if not tf.io.gfile.glob(prefix + "*"):
      raise ValueError(f"No data iterator state at {prefix}.")
    stats_path = os.path.join(d, "stats.json")
    saved = {}
    if tf.io.gfile.exists(stats_path):
      with tf.io.gfile.GFile(stats_path) as f:
        saved = json.load(f)
    shapes = saved.pop("shapes", None)
    consumed = saved.pop("examples_consumed", None)
    skipped = int(saved.pop("skipped_batches", 0))
    self.stats.update({k: v for k, v in saved.items() if k in self.stats or
                       k.startswith(SOURCE_PREFIX)})
    if shapes is None or shapes == self.shapes():
      if skipped:  # The state is of the skipped pipeline: rebuild it first.
        self._reset(skipped)
      self._ckpt.read(prefix).assert_consumed()
      self._batches = saved.get("batches", 0)
      self._examples = consumed or 0
      return
    self._skip_to(consumed, shapes)

  def next_rows(self, rows: int) -> dict[str, np.ndarray]:
    """The next `rows` rows: as many consecutive batches of this pipeline,
    concatenated (a batch-size warm-up's steps over one stream, which
    saves and resumes like any other)."""
    size = self.batch_size()
    if size is None or rows % size:
      raise ValueError(f"{rows} rows are not whole batches of {size}.")
    parts = [next(self) for _ in range(rows // size)]
    return parts[0] if len(parts) == 1 else {
        k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  @property
  def examples_consumed(self) -> int:
    return self._examples

  def continue_after(self, consumed: int) -> int:
    """Start this (fresh) pipeline after `consumed` examples of another
    pipeline of the same data: skips ceil(consumed / batch size) batches.
    Returns the number skipped."""
    if self.batch_size() is None:
      raise ValueError("A pipeline of varying batch sizes cannot continue "
                       "another pipeline's data position.")
    skip = math.ceil(consumed / self.batch_size())
    self._reset(skip)
    return skip

  def _reset(self, skip: int) -> None:
    self._it = iter(self._ds.skip(skip)) if skip else iter(self._ds)
    self._ckpt = tf.train.Checkpoint(iterator=self._it)
    self._skipped = skip
    self._batches, self._examples = skip, skip * (self.batch_size() or 0)

  def _skip_to(self, consumed: int, saved_shapes: dict) -> None:
    """Another batch / sequence shape: go to the same number of examples."""
    if consumed is None or self.batch_size() is None:
      raise ValueError(
          "The saved data position cannot be carried over to batches of "
          f"other shapes ({saved_shapes.get('input_ids')} -> "
          f"{self.shapes().get('input_ids')}); resume with the checkpoint's "
          "batch_size and seq_length.")
    skip = self.continue_after(consumed)
    logging.warning(
        "Data shapes changed since the checkpoint (%s -> %s): the data "
        "position is carried over as examples consumed (%d on process %d), "
        "skipping %d batches of the new pipeline.",
        saved_shapes.get("input_ids"), self.shapes().get("input_ids"),
        consumed, self.process_index, skip)

