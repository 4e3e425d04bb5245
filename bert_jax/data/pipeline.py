"""BERT pretraining input pipeline: text -> tokens -> examples -> masked batches.

Everything runs inside one tf.data graph with stateless random ops, so the
iterator state (including shuffle buffers) can be saved with each checkpoint
and a resumed run sees exactly the batches the uninterrupted run would have.

This module assembles the datasets; the pieces live beside it: which sources
(``data_sources.plan``), the tokenizer (``tokenizers.load_tokenizer``),
examples from blocks of lines (``examples``), masking (``masking``) and the
saveable iterator (``data_iterator``).

Flow per source (see ``data_sources``)::

  files (this host's share, reshuffled per epoch by a stateless shuffle)
    -> interleave(TextLineDataset + a trailing "" = end of document)
    -> blocks of ``data.block_lines`` consecutive lines of one file
    -> examples.ExampleBuilder (one vectorized map per block)
    -> unbatch -> [shard by example when there are too few files]
  -> mix sources by weight -> shuffle(examples)
  -> [data.packing: windows of examples -> packed rows (``packing``)]
  -> batch(per-host batch)
  -> Masker (in graph, seeded by (seed, batch index): dynamic masking)
  -> prefetch

Memory is bounded by the blocks in flight, the shuffle buffer and the prefetch
buffer; the corpus is never held (the file list is).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from bert_jax.data import examples
from bert_jax.data import features
from bert_jax.data import iterator as data_iterator
from bert_jax.data import masking
from bert_jax.data import packing
from bert_jax.data import shard_source
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers

AUTOTUNE = tf.data.AUTOTUNE
try:  # The pipeline runs on the host CPU: keep TF off the accelerators JAX uses.
  tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):  # already initialized
  pass
# Autograph adds seconds of tracing per function and none of this code needs it.
_nc = tf.autograph.experimental.do_not_convert


# -----------------------------------------------------------------------------
# Seeds.
# -----------------------------------------------------------------------------


def _seed(config, *salt: Any) -> np.ndarray:
  """A [2] int64 seed derived from config.train.seed and a salt."""
  ints = [int(config.train.seed)] + [
      int.from_bytes(hashlib.sha256(str(s).encode()).digest()[:4], "little")
      for s in salt]
  return np.random.SeedSequence(ints).generate_state(2, np.uint32).astype(
      np.int64)


def _fold(seed: tf.Tensor, *data: Any) -> tf.Tensor:
  seed = tf.cast(seed, tf.int64)
  for d in data:
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(d, tf.int64))
  return seed


# -----------------------------------------------------------------------------
# Startup checks.
# -----------------------------------------------------------------------------


# -----------------------------------------------------------------------------
# Traced pipeline stages, cached.
# -----------------------------------------------------------------------------
# Tracing the example builder or the masker into a tf.function costs seconds
# (the tokenizer op and the vectorized builder are large graphs), and every
# dataset a process builds (train, eval, the non-empty probe, a re-created
# Trainer) would otherwise trace its own copy. These caches key on the
# tokenizer object (by identity: its tf_text resources are what the graph
# captures) and on the hashable options the stage reads; they hold both alive
# for the life of the process, which is what a trainer wants.


@functools.lru_cache(maxsize=16)
def traced_builder(tok: tokenizers.Tokenizer,
                   options: examples.ExampleOptions):
  """ExampleBuilder(tok, options) as a tf.function traced once per key."""
  return tf.function(examples.ExampleBuilder(tok, options), autograph=False,
                     input_signature=[tf.TensorSpec([None], tf.string),
                                      tf.TensorSpec([2], tf.int64)])


@functools.lru_cache(maxsize=16)
def traced_token_builder(tok: tokenizers.Tokenizer,
                         options: examples.ExampleOptions):
  """ExampleBuilder(tok, options).from_tokens as a tf.function (the blocks
  of pre-tokenized shards)."""
  return tf.function(examples.ExampleBuilder(tok, options).from_tokens,
                     autograph=False)


@functools.lru_cache(maxsize=16)
def traced_masker(tok: tokenizers.Tokenizer, seq_length: int,
                  max_predictions: int, mask_rate: float,
                  mask_token_prob: float, random_token_prob: float,
                  whole_word: bool, max_ngram: int = 1):
  """masking.Masker for tok as a tf.function traced once per key."""
  masker = masking.Masker(
      vocab_size=tok.vocab_size, special_ids=tok.special_ids,
      mask_id=tok.mask_id, max_predictions=max_predictions,
      mask_rate=mask_rate, mask_token_prob=mask_token_prob,
      random_token_prob=random_token_prob, whole_word=whole_word,
      word_start=tok.word_start if whole_word else None, max_ngram=max_ngram)
  return tf.function(masker, autograph=False, input_signature=[
      tf.TensorSpec([None, seq_length], tf.int32),
      tf.TensorSpec([2], tf.int64)])


def _masker_for(data, tok):
  return traced_masker(
      tok, int(data.seq_length), int(data.max_predictions_per_seq),
      float(data.mask_rate), float(data.mask_token_prob),
      float(data.random_token_prob), bool(data.whole_word_mask),
      int(data.max_ngram))


# -----------------------------------------------------------------------------
# Datasets.
# -----------------------------------------------------------------------------


def _source_examples(source: data_sources.Source, builders,
                     data, seed: np.ndarray, process_index: int,
                     process_count: int, epochs: Optional[int]
                     ) -> tf.data.Dataset:
  """Examples of one source for this process; `epochs=None` repeats forever.

  builders: a traced ExampleBuilder, (lines [L], seed [2]) -> examples
  [C, ...], and its ``from_tokens`` (the blocks of pre-tokenized shards).
  """
  builder, token_builder = builders
  if source.kind == data_sources.SHARDS:
    return shard_source.examples(source.spec, token_builder, data, seed,
                                 process_index, process_count, epochs)
  block_lines = int(data.block_lines)

  def blocks_to_examples(lines: tf.data.Dataset, key, epoch) -> tf.data.Dataset:
    blocks = lines.batch(block_lines).enumerate()
    return blocks.map(
        _nc(lambda i, b: builder(b, _fold(seed, key, epoch, i))),
        num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()

  if source.kind == data_sources.TFDS:
    docs = data_sources.tfds_documents(
        source, data.get("tfds_data_dir", ""), data.get("tfds_text_key", "text"),
        process_index, process_count)
    lines = docs.map(_nc(data_sources.document_to_lines)).unbatch()
    lines = lines.repeat(epochs)
    key = data_sources.file_key(source.spec + ":" + source.split)
    return blocks_to_examples(lines, key, 0)

  files, _ = data_sources.resolve_text_files(source)
  by_file = len(files) >= process_count
  if by_file:
    files = files[process_index::process_count]
  keys = [data_sources.file_key(f) for f in files]

  def one_file(path, key, epoch):
    lines = tf.data.TextLineDataset(path).concatenate(
        tf.data.Dataset.from_tensors(tf.constant("")))
    return blocks_to_examples(lines, key, epoch)

  return shard_source.files_order(
      (tf.constant(files), tf.constant(keys, tf.int64)), one_file,
      by_file=by_file, seed=seed, data=data, process_index=process_index,
      process_count=process_count, epochs=epochs)


def example_dataset(config, tok, plan: data_sources.SourcePlan,
                    process_index: int = 0, process_count: int = 1,
                    mode: str = "train", epochs: Optional[int] = None
                    ) -> tf.data.Dataset:
  """Unbatched, unmasked examples of the plan's train or eval sources."""
  data = config.data
  if mode == "eval":
    sources = plan.eval
    bmode = "eval" if plan.eval_from_train else "all"
  else:
    sources = plan.train
    bmode = "train" if plan.holds_out else "all"
  options = examples.ExampleOptions.from_config(
      data, bmode, data.get("eval_fraction", 0.0))
  builders = (traced_builder(tok, options),
              traced_token_builder(tok, options))
  if len(sources) == 1:
    return _source_examples(sources[0], builders, data,
                            _seed(config, mode, "source", 0), process_index,
                            process_count, epochs)
  dsets = [
      _source_examples(s, tuple(_counted(b, i, len(sources))
                                for b in builders),
                       data, _seed(config, mode, "source", i),
                       process_index, process_count, epochs)
      for i, s in enumerate(sources)]
  weights = data_sources.mixing_weights(
      sources, float(data.get("source_temperature", 0.0)),
      data.get("tfds_data_dir", ""))
  return tf.data.Dataset.sample_from_datasets(
      dsets, weights=weights, seed=int(_seed(config, mode, "mix")[0]),
      stop_on_empty_dataset=epochs is not None)


def _counted(builder, index: int, count: int):
  """`builder` whose examples also count themselves as source `index` of
  `count`: a one-hot appended to the counters under examples.STATS_KEY
  (summed per batch like the others: the iterator's examples by source)."""

  def build(*args):  # Text (lines, seed) or shard blocks alike.
    out = builder(*args)
    rows = tf.shape(out[examples.STATS_KEY])[0]
    one = tf.one_hot(tf.fill([rows], index), count, dtype=tf.int32)
    return dict(out, **{examples.STATS_KEY: tf.concat(
        [out[examples.STATS_KEY], one], axis=1)})

  return build


def packed_rows(ds: tf.data.Dataset, data, tok, seed: np.ndarray
                ) -> tf.data.Dataset:
  """Unbatched examples -> unbatched packed rows (features.PACKED_PRETRAINING
  less the masking), window by window; stateless, so resumable."""
  options = packing.PackingOptions.from_config(data)
  t, s = int(data.seq_length), options.max_sequences
  pad_id = 0 if tok.pad_id is None else int(tok.pad_id)
  seed_t = tf.constant(seed)

  def pack(i, ex):
    rows = packing.pack_window(
        {"input_ids": ex["input_ids"], "segment_ids": ex["segment_ids"]},
        {"next_sentence_labels": ex["next_sentence_labels"]},
        tf.reduce_sum(ex["input_mask"], axis=1), seq_length=t,
        max_sequences=s, pad_values={"input_ids": pad_id},
        seed=_fold(seed_t, i))
    rows["next_sentence_weights"] = rows.pop(packing.SEQUENCE_WEIGHTS)
    rows[examples.STATS_KEY] = packing.share_out(
        tf.reduce_sum(ex[examples.STATS_KEY], axis=0),
        tf.shape(rows["input_ids"])[0])
    return rows

  ds = ds.batch(options.window).enumerate()
  return ds.map(_nc(pack), num_parallel_calls=AUTOTUNE,
                deterministic=True).unbatch()


def per_host_batch_size(config, process_count: int) -> int:
  b = int(config.train.batch_size)
  if b % process_count:
    raise ValueError(f"train.batch_size={b} is not divisible by the process "
                     f"count {process_count}.")
  return b // process_count


def make_dataset(config, tok, plan: data_sources.SourcePlan, *,
                 process_index: int = 0,
                 process_count: int = 1, mode: str = "train",
                 epochs: Optional[int] = None, batch_size: Optional[int] = None,
                 shuffle: Optional[bool] = None, keep_stats: bool = True
                 ) -> tf.data.Dataset:
  """The batched, masked tf.data pipeline (mode 'train' or 'eval')."""
  data = config.data
  bsz = batch_size or per_host_batch_size(config, process_count)
  ds = example_dataset(config, tok, plan, process_index, process_count, mode,
                       epochs)
  if shuffle is None:
    shuffle = mode == "train"
  if shuffle and data.shuffle_buffer > 0:
    ds = ds.shuffle(int(data.shuffle_buffer),
                    seed=int(_seed(config, mode, "shuffle", process_index)[0]),
                    reshuffle_each_iteration=True)
  if data.get("packing", False):
    ds = packed_rows(ds, data, tok, _seed(config, mode, "pack", process_index))
  ds = ds.batch(bsz, drop_remainder=True).enumerate()
  masker = _masker_for(data, tok)
  mask_seed = tf.constant(_seed(config, mode, "mask", process_index))

  def finish(i, ex):
    masked = masker(ex["input_ids"], _fold(mask_seed, i))  # ids, masked_lm_*
    out = {k: masked[k] if k in masked else ex[k]
           for k in features.pretraining_spec(data)}
    if keep_stats:
      out[examples.STATS_KEY] = tf.reduce_sum(ex[examples.STATS_KEY], axis=0)
    return out

  ds = ds.map(_nc(finish), num_parallel_calls=AUTOTUNE, deterministic=True)
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = False
  ds = ds.with_options(options)
  return ds.prefetch(2)


def _looks_nonempty(sources, tok, process_index, process_count) -> bool:
  """Cheap check: this process's first text lines hold enough tokens."""
  if any(src.kind != data_sources.TEXT for src in sources):
    return False
  lines = []
  for src in sources:
    files, _ = data_sources.resolve_text_files(src)
    if len(files) >= process_count:
      files = files[process_index::process_count]
    for path in files:
      with tf.io.gfile.GFile(path, "rb") as f:
        for raw in f:
          line = raw[:4096].decode("utf-8", errors="replace").strip()
          if line:
            lines.append(line)
          if len(lines) >= 256:
            break
      if len(lines) >= 256:
        break
  if not lines:
    return False
  n_tokens = int(tf.size(tok.tokenize(tf.constant(lines)).flat_values))
  return n_tokens >= 64 * process_count


def _check_nonempty(config, tok, plan: data_sources.SourcePlan,
                    process_index: int, process_count: int, mode: str) -> None:
  """Raises ValueError if the data yields no example (instead of hanging)."""
  if mode == "train":
    sources, quick = plan.train, not plan.holds_out
  else:
    sources, quick = plan.eval, not plan.eval_from_train
  field = (("data.sources" if config.data.get("sources", "") else
            "data.train_files") if mode == "train" or plan.eval_from_train
           else ("data.eval_sources" if config.data.get("eval_sources", "")
                 else "data.eval_files"))
  for source in sources:
    data_sources.check_usable(source, int(config.data.max_line_bytes), field)
  if quick and _looks_nonempty(sources, tok, process_index, process_count):
    return
  probe = example_dataset(config, tok, plan, process_index, process_count,
                          mode, epochs=1).take(1)
  for _ in probe:
    return
  src = "the demo corpus" if plan.uses_demo else "; ".join(map(str, sources))
  if mode == "eval" and plan.eval_from_train:
    src = f"held-out documents of {src}"
  raise ValueError(
      f"The {mode} data ({src}) produced no examples for process "
      f"{process_index}/{process_count}: every document is empty, "
      "whitespace-only, held out or shorter than 2 tokens.")


# -----------------------------------------------------------------------------
# What the trainer asks for.
# -----------------------------------------------------------------------------


def create_train_iterator(config, tok, workdir, process_index: int = 0,
                          process_count: int = 1,
                          batch_size: Optional[int] = None
                          ) -> data_iterator.DataIterator:
  """Endless iterator of per-host training batches (dicts of numpy arrays)
  of `batch_size` rows (None: the config's per-host batch)."""
  plan = data_sources.plan(config.data, workdir)
  _check_nonempty(config, tok, plan, process_index, process_count, "train")
  ds = make_dataset(config, tok, plan, process_index=process_index,
                    process_count=process_count, mode="train",
                    batch_size=batch_size)
  names = [s.name for s in plan.train] if len(plan.train) > 1 else []
  it = data_iterator.DataIterator(ds, process_index, source_names=names)
  it.sources = ("the demo corpus" if plan.uses_demo else
                "; ".join(map(str, plan.train)))
  return it


@dataclasses.dataclass(frozen=True)
class _EvalRequest:
  """Key of the eval-batch cache: equal when the batches would be equal.

  Only ``key`` (the data config, batch size, seed, workdir, tokenizer file and
  process) takes part in equality and hashing; config and tok ride along so
  the cached function can build the batches on a miss.
  """
  key: str
  config: Any = dataclasses.field(compare=False)
  tok: Any = dataclasses.field(compare=False)
  workdir: Optional[str] = dataclasses.field(compare=False)
  process_index: int = dataclasses.field(compare=False)
  process_count: int = dataclasses.field(compare=False)


@functools.lru_cache(maxsize=8)
def _eval_batches(req: _EvalRequest) -> tuple[dict[str, np.ndarray], ...]:
  """The eval batches of a request, built once per process.

  Building them traces the pipeline and reads the eval documents (seconds);
  a process re-creates them whenever it makes another Trainer for the same
  run (tests, tools, an in-process restart), and they never change.
  """
  plan = data_sources.plan(req.config.data, req.workdir)
  _check_nonempty(req.config, req.tok, plan, req.process_index,
                  req.process_count, "eval")
  ds = make_dataset(req.config, req.tok, plan,
                    process_index=req.process_index,
                    process_count=req.process_count, mode="eval",
                    keep_stats=False)
  return tuple({k: v.numpy() for k, v in b.items()}
               for b in ds.take(int(req.config.data.num_eval_batches)))


def create_eval_batches(config, tok, workdir, process_index: int = 0,
                        process_count: int = 1) -> list[dict[str, np.ndarray]]:
  """data.num_eval_batches held-out batches, identical on every call."""
  key = json.dumps([config.data.to_dict(), config.train.batch_size,
                    config.train.seed, workdir, tok.path, process_index,
                    process_count], sort_keys=True, default=str)
  batches = _eval_batches(_EvalRequest(key, config, tok, workdir,
                                       process_index, process_count))
  return [dict(b) for b in batches]
