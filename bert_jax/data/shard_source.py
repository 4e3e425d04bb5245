"""Training from pre-tokenized shards (``data.sources="shards:DIR"``).

Each block of a shard (``shard_format``) goes through the same example
building (``examples.ExampleBuilder.from_tokens``, seeded by the shard's
source-file key, the epoch and the block index as the text pipeline seeds
it), packing and masking as text does. Two orders (``data.shard_order``):

  "global"  every epoch a fresh pseudo-random permutation of all blocks of
            all shards (a keyed Feistel network over the block numbers,
            cycle-walked into range: O(1) memory, stateless), so a
            document's place in the corpus says nothing about when it is
            seen; host h reads positions h, h + P, h + 2P, ... of it.
  "files"   the text pipeline's order: shards (one per source file)
            permuted per epoch, data.cycle_length of them interleaved, each
            read in order; with the same config a run from shards sees the
            batches a run from the text files sees.

Blocks are read by offset (a stateless ``tf.numpy_function``: same block,
same arrays), so the iterator's position is saved and restored exactly.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
import tensorflow as tf

from bert_jax.data import shard_format

AUTOTUNE = tf.data.AUTOTUNE
_nc = tf.autograph.experimental.do_not_convert
_MAX_EPOCHS = 1 << 40
ORDERS = ("global", "files")
_ROUNDS = 4


def _fold(seed, *data):
  seed = tf.cast(seed, tf.int64)
  for d in data:
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(d, tf.int64))
  return seed


# -----------------------------------------------------------------------------
# Reading blocks.
# -----------------------------------------------------------------------------
class _Blocks:
  """Random access to the blocks of a manifest's shards."""

  def __init__(self, manifest: shard_format.Manifest):
    self.paths = [manifest.path(s, "blocks") for s in manifest.shards]
    self.offsets = [manifest.offsets(s) for s in manifest.shards]
    self.counts = np.asarray([len(o) - 1 for o in self.offsets], np.int64)
    self._local = threading.local()  # Open files per reading thread.

  def _file(self, i: int):
    files = self._local.__dict__.setdefault("files", {})
    if i not in files:
      files[i] = shard_format.open_file(self.paths[i])
    return files[i]

  def read(self, shard, block):
    shard, block = int(shard), int(block)
    start, end = self.offsets[shard][block:block + 2]
    f = self._file(shard)
    f.seek(int(start))
    d = shard_format.decode_block(f.read(int(end - start)))
    return (d["tokens"], d["lengths"], d["hashes"], d["docs"], d["last_doc"],
            d["line_stats"])


def _read(blocks: _Blocks, shard, block) -> dict:
  """In graph: block `block` of shard `shard` as ``tokenize_block`` gives
  it."""
  tokens, lengths, hashes, docs, last_doc, stats = tf.numpy_function(
      blocks.read, [shard, block],
      [tf.int32, tf.int64, tf.int64, tf.int32, tf.int32, tf.int32],
      stateful=False)
  for x, shape in ((tokens, [None]), (lengths, [None]), (hashes, [None]),
                   (docs, [None]), (last_doc, []), (stats, [4])):
    x.set_shape(shape)
  return dict(tokens=tf.RaggedTensor.from_row_lengths(tokens, lengths,
                                                      validate=False),
              hashes=hashes, docs=docs, last_doc=last_doc, line_stats=stats)


# -----------------------------------------------------------------------------
# The global order: a keyed pseudo-random permutation of [0, n).
# -----------------------------------------------------------------------------
def _round(r, key, mask):
  """A Feistel round function: r and key below 2^32, products below 2^63."""
  f = tf.bitwise.bitwise_and(r * 0x5BD1E995 + key, 0xFFFFFFFF)
  f = tf.bitwise.bitwise_xor(f, tf.bitwise.right_shift(f, 15))
  f = tf.bitwise.bitwise_and(f * 0x2C1B3C6D, 0xFFFFFFFF)
  f = tf.bitwise.bitwise_xor(f, tf.bitwise.right_shift(f, 13))
  return tf.bitwise.bitwise_and(f, mask)


def permute(x, n: int, keys):
  """x in [0, n) -> its place in a permutation of [0, n) keyed by `keys`
  (int64 [_ROUNDS], each below 2^31): a balanced Feistel network on
  2 * h bits (2^(2h) >= n), walked again while it lands past n."""
  half = max(1, (max(int(n) - 1, 1).bit_length() + 1) // 2)
  mask = tf.constant((1 << half) - 1, tf.int64)

  def once(y):
    left = tf.bitwise.right_shift(y, half)
    right = tf.bitwise.bitwise_and(y, mask)
    for i in range(_ROUNDS):
      left, right = right, tf.bitwise.bitwise_xor(
          left, _round(right, keys[i], mask))
    return tf.bitwise.bitwise_or(tf.bitwise.left_shift(left, half), right)

  return tf.while_loop(lambda y: y >= n, lambda y: (once(y),),
                       (once(tf.cast(x, tf.int64)),))[0]


def epoch_keys(seed, epoch):
  """The permutation keys of an epoch (int64 [_ROUNDS], below 2^31)."""
  return tf.random.stateless_uniform([_ROUNDS], _fold(seed, 11, epoch),
                                     minval=0, maxval=(1 << 31) - 1,
                                     dtype=tf.int64)


# -----------------------------------------------------------------------------
# Examples of a shards source.
# -----------------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def _blocks_of(directory: str) -> tuple[shard_format.Manifest, _Blocks]:
  manifest = shard_format.read_manifest(directory)
  return manifest, _Blocks(manifest)


def examples(directory: str, builder, data, seed: np.ndarray,
             process_index: int, process_count: int, epochs
             ) -> tf.data.Dataset:
  """Examples of the shards in `directory` for this process (`epochs`
  None: forever). builder: ``ExampleBuilder.from_tokens`` (traced)."""
  manifest, blocks = _blocks_of(directory)
  keys_t = tf.constant([s.key for s in manifest.shards], tf.int64)
  counts_t = tf.constant(blocks.counts)

  def build(shard, block, key, epoch):
    return builder(**_read(blocks, shard, block),
                   seed=_fold(seed, key, epoch, block))

  if data.get("shard_order", "global") == "files":
    return _shards_in_files_order(manifest, build, keys_t, counts_t, data,
                                  seed, process_index, process_count, epochs)
  total = int(blocks.counts.sum())
  ends = tf.constant(np.cumsum(blocks.counts))

  def one_epoch(epoch):
    keys = epoch_keys(tf.constant(seed), epoch)

    def at(position):
      g = permute(position, total, keys)
      shard = tf.searchsorted(ends, g[None], side="right")[0]
      block = g - (ends[shard] - counts_t[shard])
      return build(shard, block, keys_t[shard], epoch)

    return tf.data.Dataset.range(process_index, total, process_count).map(
        _nc(at), num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()

  return tf.data.Dataset.range(epochs or _MAX_EPOCHS).flat_map(_nc(one_epoch))


def _shards_in_files_order(manifest, build, keys_t, counts_t, data, seed,
                           process_index, process_count, epochs):
  """The text pipeline's order over the shards (:func:`files_order`, as
  ``pipeline._source_examples`` reads their source files)."""
  order = sorted(range(len(manifest.shards)),
                 key=lambda i: manifest.shards[i].source)
  by_file = len(order) >= process_count
  if by_file:
    order = order[process_index::process_count]

  def one_file(shard, epoch):
    return tf.data.Dataset.range(counts_t[shard]).map(
        _nc(lambda b: build(shard, b, keys_t[shard], epoch)),
        num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()

  return files_order((tf.constant(order, tf.int64),), one_file,
                     by_file=by_file, seed=seed, data=data,
                     process_index=process_index,
                     process_count=process_count, epochs=epochs)


def files_order(items: tuple, one_file, *, by_file: bool, seed, data,
                process_index: int, process_count: int, epochs
                ) -> tf.data.Dataset:
  """Examples of source files in the text pipeline's order, one rule for
  the text files and for their shards ("files" order), so that a run from
  either sees the same batches: every epoch the files in a stateless
  shuffle keyed by (seed, epoch), data.cycle_length of them read at once,
  an example of each in turn. `items`: [N] tensors, one entry a file;
  `one_file(*entries, epoch)`: its examples. When `by_file` the items are
  this host's files; else every host reads them all and keeps every
  process_count-th example."""
  n = int(items[0].shape[0])
  file_seed = tf.constant(seed)
  cycle = max(1, min(int(data.get("cycle_length", 8)), n))

  def one_epoch(epoch):
    perm = tf.random.experimental.stateless_shuffle(
        tf.range(n), _fold(file_seed, 7, epoch))
    ds = tf.data.Dataset.from_tensor_slices(
        tuple(tf.gather(t, perm) for t in items))
    ds = ds.interleave(_nc(lambda *file: one_file(*file, epoch)),
                       cycle_length=cycle, block_length=1,
                       num_parallel_calls=AUTOTUNE, deterministic=True)
    if not by_file and process_count > 1:
      ds = ds.shard(process_count, process_index)
    return ds

  return tf.data.Dataset.range(epochs or _MAX_EPOCHS).flat_map(_nc(one_epoch))
