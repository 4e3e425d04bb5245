"""Packing: several examples per row, inside the tf.data graph.

A window of ``data.packing_window`` consecutive examples (after the shuffle)
is bin-packed into rows of ``seq_length`` slots: best-fit decreasing, at most
``data.packing_max_sequences`` (S) examples a row. Examples are visited
longest first (ties in stream order); each goes to the open row it leaves
with the least room, or opens a new row. Deterministic, with no state
carried between windows, so the pipeline's iterator can be checkpointed and
a resumed run sees the same rows (a window's last rows may be less full: the
price of that, small for windows of hundreds of examples). The rows of a
window come out in a stateless random order keyed by the window's index, so
a batch does not hold only the window's longest (or shortest) examples.

A packed row (``features.PACKING``): the examples one after another, each
starting with its own ``[CLS]``; ``sequence_ids`` 1..k (0 at the padding
after the last), ``position_ids`` restarting at 0 in each example,
``segment_ids`` (token types) as the example had them, ``cls_positions``
[S] where each example starts (0 in an empty slot) and each per-example
feature (a label, an example index) as an [S] vector, with
``sequence_weights`` [S] 1.0 in occupied slots. Attention stays inside each
example (``models/attention.py``).

Used by pretraining (``pipeline.py``: NSP/SOP pairs, or document chunks with
``data.objective="packed"``) and fine-tuning (``task_data.py``).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

SEQUENCE_WEIGHTS = "sequence_weights"


@dataclasses.dataclass(frozen=True)
class PackingOptions:
  """What packing reads from the config (``data.packing_*``)."""
  max_sequences: int  # S: examples a row may hold.
  window: int  # Examples bin-packed together.

  @classmethod
  def from_config(cls, data) -> "PackingOptions | None":
    """The options of a `data` config group, None when packing is off."""
    if not data.get("packing", False):
      return None
    return cls(max_sequences=int(data.packing_max_sequences),
               window=int(data.packing_window))


def best_fit_decreasing(lengths: tf.Tensor, capacity: int,
                        max_sequences: int):
  """Assigns examples of `lengths` [W] to rows of `capacity` slots.

  Returns (row [W], slot [W], offset [W], num_rows): example e goes to row
  `row[e]` as its `slot[e]`-th sequence, starting at token `offset[e]`.
  Examples of length 0 (window padding) get row -1 (slot and offset 0).
  """
  lengths = tf.cast(lengths, tf.int32)
  w = tf.size(lengths)
  order = tf.argsort(-lengths, stable=True)
  bins = tf.range(w)
  none_fit = capacity + 1

  def body(i, used, count, num_rows, rows, slots, offsets):
    e = order[i]
    n = lengths[e]
    space = capacity - used
    fits = (bins < num_rows) & (space >= n) & (count < max_sequences)
    any_fit = tf.reduce_any(fits)
    best = tf.argmin(tf.where(fits, space, none_fit), output_type=tf.int32)
    r = tf.where(any_fit, best, num_rows)
    real = n > 0
    one = tf.reshape(r, [1, 1])
    rows = rows.write(i, tf.where(real, r, -1))
    slots = slots.write(i, tf.where(real, count[r], 0))
    offsets = offsets.write(i, tf.where(real, used[r], 0))
    used = tf.tensor_scatter_nd_add(used, one, tf.reshape(
        tf.where(real, n, 0), [1]))
    count = tf.tensor_scatter_nd_add(count, one, tf.reshape(
        tf.cast(real, tf.int32), [1]))
    num_rows += tf.cast(real & ~any_fit, tf.int32)
    return i + 1, used, count, num_rows, rows, slots, offsets

  zeros = tf.zeros([w], tf.int32)
  arrays = [tf.TensorArray(tf.int32, size=w) for _ in range(3)]
  _, _, _, num_rows, rows, slots, offsets = tf.while_loop(
      lambda i, *_: i < w, body,
      (tf.constant(0), zeros, zeros, tf.constant(0), *arrays))
  # Back from visiting order to stream order.
  unsort = lambda a: tf.scatter_nd(order[:, None], a.stack(), [w])
  return unsort(rows), unsort(slots), unsort(offsets), num_rows


def pack_window(tokens: dict, per_sequence: dict, lengths: tf.Tensor, *,
                seq_length: int, max_sequences: int, pad_values: dict,
                seed: tf.Tensor | None = None) -> dict:
  """One window of examples -> packed rows.

  Args:
    tokens: {name: [W, L] int32} per-token features, example e's first
      lengths[e] entries real (L <= seq_length).
    per_sequence: {name: [W]} per-example features (labels, indices).
    lengths: [W] real tokens of each example (0: no example).
    seq_length, max_sequences: row shape T and sequences per row S.
    pad_values: {name: value} for padded token slots and empty sequence
      slots (default 0).
    seed: [2] int64; the rows come out in a stateless random order keyed by
      it (None: in packing order).

  Returns:
    {name: [R, T]} for `tokens` plus input_mask, sequence_ids, position_ids;
    {name: [R, S]} for `per_sequence` plus cls_positions and
    sequence_weights (float32, 1.0 in occupied slots).
  """
  t, s = int(seq_length), int(max_sequences)
  lengths = tf.cast(lengths, tf.int32)
  row, slot, offset, r = best_fit_decreasing(lengths, t, s)
  if seed is not None:
    perm = tf.random.experimental.stateless_shuffle(tf.range(r), seed)
    new_row = tf.scatter_nd(perm[:, None], tf.range(r), [r])
    row = tf.where(row >= 0, tf.gather(new_row, tf.maximum(row, 0)), -1)
  width = tf.shape(next(iter(tokens.values())))[1]
  p = tf.range(width)[None, :]
  real = (p < lengths[:, None]) & (row[:, None] >= 0)  # [W, L]
  where = tf.where(real)  # [N, 2] (example, position)
  e, pos = tf.cast(where[:, 0], tf.int32), tf.cast(where[:, 1], tf.int32)
  to = tf.stack([tf.gather(row, e), tf.gather(offset, e) + pos], axis=1)
  shape = tf.stack([r, t])

  filled = tf.scatter_nd(to, tf.ones_like(e), shape)

  def scatter(values, pad=0):
    return tf.where(filled > 0, tf.scatter_nd(to, values, shape), pad)

  out = {}
  for name, x in tokens.items():
    out[name] = scatter(tf.gather_nd(tf.cast(x, tf.int32), where),
                        int(pad_values.get(name, 0)))
  out["input_mask"] = filled
  out["sequence_ids"] = scatter(tf.gather(slot, e) + 1)
  out["position_ids"] = scatter(pos)

  placed = tf.where(row >= 0)[:, 0]
  at = tf.stack([tf.gather(row, placed), tf.gather(slot, placed)], axis=1)
  seq_shape = tf.stack([r, s])

  def scatter_seq(values, pad):
    values = tf.gather(values, placed)
    filled = tf.scatter_nd(at, tf.ones_like(values), seq_shape)
    return tf.scatter_nd(at, values, seq_shape) + (1 - filled) * pad

  for name, x in per_sequence.items():
    pad = tf.cast(pad_values.get(name, 0), x.dtype)
    out[name] = scatter_seq(x, pad)
  out["cls_positions"] = scatter_seq(offset, tf.constant(0, tf.int32))
  out[SEQUENCE_WEIGHTS] = scatter_seq(tf.ones_like(lengths, tf.float32),
                                      tf.constant(0.0))
  for name in list(tokens) + ["input_mask", "sequence_ids", "position_ids"]:
    out[name] = tf.ensure_shape(out[name], [None, t])
  for name in list(per_sequence) + ["cls_positions", SEQUENCE_WEIGHTS]:
    out[name] = tf.ensure_shape(out[name], [None, s])
  return out


def share_out(stats: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
  """[C] counters -> [rows, C] that sum to them (row i gets c // rows, plus
  1 for i < c % rows), so every row carries its share."""
  n = tf.maximum(rows, 1)
  i = tf.range(rows)[:, None]
  return stats[None, :] // n + tf.cast(i < (stats % n)[None, :], stats.dtype)
