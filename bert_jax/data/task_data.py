"""Fine-tuning batches: rows -> `[CLS] A [SEP] B [SEP]` -> length buckets.

Tokenization runs in the tf.data graph with the checkpoint's own tokenizer.
Pairs are truncated longest-first to ``seq_length`` (google-research/bert's
``_truncate_seq_pair``: pop the last token of the longer text, B on ties).

Static shapes without paying for padding: each example falls in the smallest
bucket length (default 32, 64, 128, capped at and always including
``seq_length``) that holds it and every batch comes from one bucket, so XLA
compiles once per bucket. Batches hold the features of
``features.CLASSIFICATION`` / ``features.REGRESSION``, with the sequence
dimension equal to the batch's bucket length.

* Training: endless; each epoch a seeded stateless permutation of the rows
  (no shuffle buffer: the checkpointed iterator state is small and a resumed
  run continues the same stream, see ``data_iterator.DataIterator``).
* Eval: every row exactly once in a fixed order; the last batch of each bucket
  is filled with rows of ``example_weights`` 0 and ``example_index`` -1;
  ``example_index`` is the row's position in :class:`task_sources.Rows`.

Packed rows (``packing``, ``data.packing``): instead of buckets, windows of
examples are bin-packed into rows of ``seq_length`` (``packing.pack_window``:
several examples a row, attention inside each, the classifier at each
example's [CLS]); ``batch_size`` counts rows, and labels, ``example_weights``
and ``example_index`` are [S] per row (0 / 0 / -1 in an empty slot). Eval
still covers every row exactly once: each example sits in one slot of one
row, and the last batch is filled with empty rows.

Multi-host: every process runs the same pipeline over the whole split and keeps
its slice of each GLOBAL batch. Bucketing forces this: all processes must feed
the same bucket length at the same step, which a per-process read of a share
of the rows cannot guarantee. Encoding is cheap next to the model step.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from bert_jax.data import feature_batches
from bert_jax.data import features
from bert_jax.data import iterator as data_iterator
from bert_jax.data import packing as packing_lib
from bert_jax.data import task_sources
from bert_jax.data import tokenizers

# The bucket lengths and the row-index key are feature_batches' (one home
# for every task kind's batches).
INDEX = feature_batches.INDEX
_ENCODE_BATCH = 256
_MAX_EPOCHS = 1 << 40
_nc = tf.autograph.experimental.do_not_convert


def feature_spec(spec: task_sources.TaskSpec, packed: bool = False) -> dict:
  return features.classification_spec(spec.regression, packed)


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
  """Reference (google-research/bert): in place, pop from the longer list."""
  while len(tokens_a) + len(tokens_b) > max_length:
    if len(tokens_a) > len(tokens_b):
      tokens_a.pop()
    else:
      tokens_b.pop()


def truncated_lengths(len_a: tf.Tensor, len_b: tf.Tensor, budget: int
                      ) -> tuple[tf.Tensor, tf.Tensor]:
  """Closed form of :func:`truncate_seq_pair` on vectors of lengths.

  Within budget: unchanged. Else if the shorter text fits in half the budget it
  is kept and the longer gets the rest; else both are cut to half, A keeping
  the odd token (ties pop B first).
  """
  short = tf.minimum(len_a, len_b)
  fits = len_a + len_b <= budget
  short_kept = 2 * short <= budget
  half_a, half_b = (budget + 1) // 2, budget // 2
  a = tf.where(fits, len_a, tf.where(short_kept, tf.where(
      len_a <= len_b, len_a, budget - short), half_a))
  b = tf.where(fits, len_b, tf.where(short_kept, tf.where(
      len_a <= len_b, budget - short, len_b), half_b))
  return a, b


def encode(tok: tokenizers.Tokenizer, seq_length: int, text_a: tf.Tensor,
           text_b: Optional[tf.Tensor] = None) -> dict[str, tf.RaggedTensor]:
  """In graph: strings [N] (and [N]) -> ragged input_ids / segment_ids."""
  if tok.cls_id is None or tok.sep_id is None:
    raise ValueError(f"Tokenizer {tok.path!r} has no [CLS] or [SEP] token; "
                     "fine-tuning needs both.")

  def cut(ids, n):
    return tf.RaggedTensor.from_tensor(ids.to_tensor(), lengths=n)

  a = tok.tokenize(text_a)
  n = tf.shape(text_a, out_type=tf.int64)[0]
  cls = tf.RaggedTensor.from_tensor(tf.fill([n, 1], tf.constant(tok.cls_id)))
  sep = tf.RaggedTensor.from_tensor(tf.fill([n, 1], tf.constant(tok.sep_id)))
  if text_b is None:
    a = cut(a, tf.minimum(a.row_lengths(), seq_length - 2))
    ids = tf.concat([cls, a, sep], axis=1)
    seg = tf.zeros_like(ids)
  else:
    b = tok.tokenize(text_b)
    na, nb = truncated_lengths(a.row_lengths(), b.row_lengths(),
                               seq_length - 3)
    a, b = cut(a, na), cut(b, nb)
    first = tf.concat([cls, a, sep], axis=1)
    second = tf.concat([b, sep], axis=1)
    ids = tf.concat([first, second], axis=1)
    seg = tf.concat([tf.zeros_like(first), tf.ones_like(second)], axis=1)
  return dict(input_ids=ids, input_mask=tf.ones_like(ids), segment_ids=seg)


def _examples(order: tf.data.Dataset, rows: task_sources.Rows,
              tok: tokenizers.Tokenizer, seq_length: int) -> tf.data.Dataset:
  """Row positions -> one encoded example each (variable length)."""
  strings = lambda a: tf.constant([str(x) for x in a], tf.string, [len(a)])
  text_a = strings(rows.text_a)
  text_b = None if rows.text_b is None else strings(rows.text_b)
  labels = tf.constant(rows.labels)

  def enc(pos):
    enc = encode(tok, seq_length, tf.gather(text_a, pos),
                 None if text_b is None else tf.gather(text_b, pos))
    out = {k: v.to_tensor() for k, v in enc.items()}  # unbatch needs dense
    out["length"] = enc["input_ids"].row_lengths()
    out["labels"] = tf.gather(labels, pos)
    out[INDEX] = tf.cast(pos, tf.int32)
    return out

  def trim(ex):
    n = ex.pop("length")
    return {k: (v[:n] if v.shape.rank else v) for k, v in ex.items()}

  ds = order.batch(_ENCODE_BATCH).map(
      _nc(enc), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  return ds.unbatch().map(_nc(trim))


def _bucketed(ds: tf.data.Dataset, lengths: tuple[int, ...], batch_size: int,
              pad_id: int) -> tf.data.Dataset:
  """Groups examples by bucket into batches padded to the bucket length."""
  bounds = tf.constant(lengths, tf.int64)

  def key(ex):
    n = tf.size(ex["input_ids"], out_type=tf.int64)
    return tf.reduce_sum(tf.cast(bounds < n, tf.int64))

  def reduce(k, window):
    t = tf.gather(bounds, k)
    shapes = {"input_ids": [t], "input_mask": [t], "segment_ids": [t],
              "labels": [], INDEX: []}
    values = {"input_ids": tf.constant(pad_id, tf.int32),
              "input_mask": tf.constant(0, tf.int32),
              "segment_ids": tf.constant(0, tf.int32),
              "labels": tf.zeros([], window.element_spec["labels"].dtype),
              INDEX: tf.constant(-1, tf.int32)}
    return window.padded_batch(batch_size, padded_shapes=shapes,
                               padding_values=values)

  return ds.group_by_window(_nc(key), _nc(reduce), window_size=batch_size)


def _finish(batch_size: int, pad_id: int, process_index: int,
            process_count: int):
  """Fills a short batch with weight-0 rows; keeps this host's slice."""
  if batch_size % process_count:
    raise ValueError(f"batch_size={batch_size} is not divisible by the "
                     f"process count {process_count}.")
  per_host = batch_size // process_count
  lo = process_index * per_host

  def fn(b):
    n = tf.shape(b["labels"])[0]
    extra = batch_size - n
    pad2 = lambda x, v: tf.pad(x, [[0, extra], [0, 0]], constant_values=v)
    pad1 = lambda x, v: tf.pad(x, [[0, extra]], constant_values=v)
    out = {
        "input_ids": pad2(b["input_ids"], pad_id),
        "input_mask": pad2(b["input_mask"], 0),
        "segment_ids": pad2(b["segment_ids"], 0),
        "labels": pad1(b["labels"], tf.zeros([], b["labels"].dtype)),
        "example_weights": pad1(tf.ones([n], tf.float32), 0.0),
        INDEX: pad1(b[INDEX], -1),
    }
    return {k: v[lo:lo + per_host] for k, v in out.items()}

  return fn


def _packed(ds: tf.data.Dataset, seq_length: int, batch_size: int,
            options: packing_lib.PackingOptions, pad_id: int, seed,
            process_index: int, process_count: int) -> tf.data.Dataset:
  """Examples -> batches of `batch_size` packed rows (the last one filled
  with empty rows), this host's slice. `seed` None: rows in packing order
  (eval), else a stateless order per window."""
  if batch_size % process_count:
    raise ValueError(f"batch_size={batch_size} is not divisible by the "
                     f"process count {process_count}.")
  label_dtype = ds.element_spec["labels"].dtype
  shapes = {"input_ids": [seq_length], "input_mask": [seq_length],
            "segment_ids": [seq_length], "labels": [], INDEX: []}
  values = {"input_ids": tf.constant(pad_id, tf.int32),
            "input_mask": tf.constant(0, tf.int32),
            "segment_ids": tf.constant(0, tf.int32),
            "labels": tf.zeros([], label_dtype),
            INDEX: tf.constant(-1, tf.int32)}
  windows = ds.padded_batch(options.window, padded_shapes=shapes,
                            padding_values=values).enumerate()

  def pack(i, w):
    rows = packing_lib.pack_window(
        {"input_ids": w["input_ids"], "segment_ids": w["segment_ids"]},
        {"labels": w["labels"], INDEX: w[INDEX]},
        tf.reduce_sum(w["input_mask"], axis=1), seq_length=seq_length,
        max_sequences=options.max_sequences,
        pad_values={"input_ids": pad_id, INDEX: -1},
        seed=None if seed is None else
        tf.random.experimental.stateless_fold_in(seed, i))
    rows["example_weights"] = rows.pop(packing_lib.SEQUENCE_WEIGHTS)
    return rows

  rows = windows.map(_nc(pack), num_parallel_calls=tf.data.AUTOTUNE,
                     deterministic=True).unbatch()
  per_host = batch_size // process_count
  lo = process_index * per_host
  pads = {"input_ids": pad_id, INDEX: -1}

  def fill(b):
    extra = batch_size - tf.shape(b["input_ids"])[0]
    out = {}
    for k, v in b.items():
      pad = [[0, extra]] + [[0, 0]] * (v.shape.rank - 1)
      out[k] = tf.pad(v, pad, constant_values=tf.cast(pads.get(k, 0),
                                                      v.dtype))
    return {k: v[lo:lo + per_host] for k, v in out.items()}

  return rows.batch(batch_size).map(_nc(fill))


def _options(ds: tf.data.Dataset) -> tf.data.Dataset:
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = False
  return ds.with_options(options).prefetch(2)


def train_dataset(rows: task_sources.Rows, tok: tokenizers.Tokenizer, *,
                  seq_length: int, batch_size: int, seed: int,
                  buckets: Sequence[int] = feature_batches.DEFAULT_BUCKETS,
                  process_index: int = 0, process_count: int = 1,
                  with_index: bool = False,
                  packing: packing_lib.PackingOptions | None = None
                  ) -> tf.data.Dataset:
  """Endless shuffled training batches of this host's share of ``batch_size``.

  Each epoch visits every row once in the order of a permutation drawn
  statelessly from (seed, epoch); batches never mix buckets and are always
  full. The iterator can be saved and restored exactly. ``seed`` must be the
  same on every process (they cut the same global batches).
  """
  n = len(rows)
  if n == 0:
    raise ValueError("The training split has no usable rows.")
  root = tf.constant([int(seed), 0x7A5C], tf.int64)

  def epoch_order(epoch):
    s = tf.random.experimental.stateless_fold_in(root, epoch)
    return tf.data.Dataset.from_tensor_slices(
        tf.cast(tf.random.experimental.stateless_shuffle(
            tf.range(n, dtype=tf.int32), s), tf.int64))

  order = tf.data.Dataset.range(_MAX_EPOCHS).flat_map(_nc(epoch_order))
  return _batches(order, rows, tok, seq_length, batch_size, buckets,
                  process_index, process_count, with_index, packing,
                  tf.random.experimental.stateless_fold_in(root, -1))


def eval_dataset(rows: task_sources.Rows, tok: tokenizers.Tokenizer, *,
                 seq_length: int, batch_size: int,
                 buckets: Sequence[int] = feature_batches.DEFAULT_BUCKETS,
                 process_index: int = 0, process_count: int = 1,
                 packing: packing_lib.PackingOptions | None = None
                 ) -> tf.data.Dataset:
  """Every row once, deterministic order, with ``example_index``."""
  order = tf.data.Dataset.range(len(rows))
  return _batches(order, rows, tok, seq_length, batch_size, buckets,
                  process_index, process_count, True, packing, None)


def _batches(order, rows, tok, seq_length, batch_size, buckets, process_index,
             process_count, with_index, packing=None, seed=None
             ) -> tf.data.Dataset:
  pad_id = 0 if tok.pad_id is None else int(tok.pad_id)
  ds = _examples(order, rows, tok, seq_length)
  if packing is not None:
    ds = _packed(ds, seq_length, batch_size, packing, pad_id, seed,
                 process_index, process_count)
  else:
    ds = _bucketed(ds, feature_batches.bucket_lengths(seq_length, buckets),
                   batch_size, pad_id)
    ds = ds.map(_nc(_finish(batch_size, pad_id, process_index,
                            process_count)))
  if not with_index:
    ds = ds.map(_nc(lambda b: {k: v for k, v in b.items() if k != INDEX}))
  return _options(ds)


def create_train_iterator(rows: task_sources.Rows, tok: tokenizers.Tokenizer,
                          **kwargs) -> data_iterator.DataIterator:
  """:func:`train_dataset` as numpy batches with ``save``/``restore``."""
  ds = train_dataset(rows, tok, **kwargs)
  return data_iterator.DataIterator(ds, kwargs.get("process_index", 0))


def eval_batches(rows: task_sources.Rows, tok: tokenizers.Tokenizer,
                 **kwargs) -> list[dict[str, np.ndarray]]:
  """:func:`eval_dataset` as a list of numpy batches."""
  return [{k: v.numpy() for k, v in b.items()}
          for b in eval_dataset(rows, tok, **kwargs)]


def steps_per_epoch(num_rows: int, batch_size: int) -> int:
  return -(-num_rows // batch_size)


def packed_rows_per_epoch(rows: task_sources.Rows, tok: tokenizers.Tokenizer,
                          *, seq_length: int,
                          packing: packing_lib.PackingOptions) -> int:
  """How many packed rows one pass over `rows` fills (in reading order; a
  shuffled epoch packs within a row or two of it): what an epoch of packed
  training is, in rows."""
  ds = _examples(tf.data.Dataset.range(len(rows)), rows, tok, seq_length)
  ds = _packed(ds, seq_length, 1, packing, 0, None, 0, 1)
  return int(ds.reduce(0, lambda n, _: n + 1))
