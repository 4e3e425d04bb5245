r"""Input pipeline throughput per host CPU core per tokenizer kind
(SentencePiece and WordPiece in graph, a tokenizer.json run host-side:
here a byte-level BPE with RoBERTa's special tokens), tokenizing on the fly
against reading pre-tokenized shards (``python -m bert_jax.pretokenize``,
whose one-time cost is measured too), and in-graph masking against
host-side numpy masking (what Hugging Face's
DataCollatorForLanguageModeling does).

  python tools/bench_input.py [--config=bert_jax/config_lib.py:base] \
      [--workdir=/tmp/bench_input] [--seconds=10] \
      [--train_tokens_per_sec=200000]

Corpus: the demo corpus (CPython docs) copied --copies times into 4 files, so
epoch boundaries do not dominate. Tokens are real (non-padding) tokens.

--train_tokens_per_sec is what one host's accelerators consume in BERT-base
training. Default 200,000: BERT-base at seq 128 costs ~0.66 GFLOP/token for a
training step (6 x 110M params), so one A100-class chip (312 TFLOP/s bf16) at
~40% MFU eats ~190k tokens/s. Pass your own (e.g. a TPU v4 host of 4 chips at
40% MFU: ~670,000).
"""

import os
import resource
import time

import numpy as np
import tensorflow as tf
from absl import flags

from bert_jax import cli
from bert_jax import config_lib
from bert_jax.data import demo_corpus
from bert_jax.data import examples
from bert_jax.data import pipeline
from bert_jax.data import pretokenizing
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers
from bert_jax.hf import tokenizer_files
from bert_jax.training import config_checks

FLAGS = flags.FLAGS


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file (default: configs/base.py's settings).",
                    argv=argv, required=False, **define)
  cli.define_workdir("Where the corpus copies and tokenizers go.",
                     default="/tmp/bench_input", **define)
  flags.DEFINE_float("seconds", 10.0, "Seconds per measurement.", **define)
  flags.DEFINE_integer("copies", 8, "Copies of the demo corpus.", **define)
  flags.DEFINE_integer("vocab_size", 8000, "Tokenizer vocab to train.",
                       **define)
  flags.DEFINE_float(
      "train_tokens_per_sec", 200_000.0,
      "Tokens/s one host's accelerators consume in a BERT-base train step.",
      **define)
  flags.DEFINE_list("kinds", ["sentencepiece", "wordpiece", "hf_json"],
                    "Tokenizers to measure.", **define)


def numpy_mask_batch(input_ids: np.ndarray, rng: np.random.Generator, *,
                     special_mask_table: np.ndarray, mask_id: int,
                     vocab_size: int, mask_rate: float = 0.15,
                     mask_token_prob: float = 0.8,
                     random_token_prob: float = 0.1):
  """Host-side masking as Hugging Face's DataCollatorForLanguageModeling does.

  Bernoulli(mask_rate) per non-special token; of those 80% [MASK], 10% random,
  10% kept. Returns (masked input_ids, labels with -100 where not selected).
  The comparison point of this benchmark (tests/data/test_masking.py checks its
  rates).
  """
  labels = input_ids.copy()
  special = special_mask_table[input_ids]
  selected = (rng.random(input_ids.shape) < mask_rate) & ~special
  labels[~selected] = -100
  r = rng.random(input_ids.shape)
  out = input_ids.copy()
  to_mask = selected & (r < mask_token_prob)
  out[to_mask] = mask_id
  to_random = selected & (r >= mask_token_prob) & (
      r < mask_token_prob + random_token_prob)
  out[to_random] = rng.integers(0, vocab_size, size=int(to_random.sum()))
  return out, labels




def num_cores() -> int:
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:
    return os.cpu_count() or 1


def write_corpus(workdir: str, copies: int) -> str:
  d = os.path.join(workdir, f"bench_corpus_x{copies}")
  glob = os.path.join(d, "part-*.txt")
  if tf.io.gfile.glob(glob):
    return glob
  tf.io.gfile.makedirs(d)
  docs = [s for _, s in demo_corpus.demo_documents()]
  for k in range(4):
    demo_corpus.write_documents(os.path.join(d, f"part-{k}.txt"),
                                docs[k::4] * copies)
  return glob


def measure(batches, seconds, host_fn=None):
  """Pulls batches for `seconds` after a warm-up.

  Returns (tokens/s, examples/s, tokens per CPU-second): the last divides by
  the CPU time this process used (all threads), so it is the per-core rate
  even when other processes share the machine.
  """
  it = iter(batches)
  t_end = time.time() + 3.0  # warm-up: graph start, shuffle buffer fill
  while time.time() < t_end:
    next(it)
  toks = exs = 0
  c0 = time.process_time()
  t0 = time.time()
  while time.time() - t0 < seconds:
    b = next(it)
    if host_fn is not None:
      b = host_fn(b)
    toks += int(b["input_mask"].sum())
    exs += b["input_mask"].shape[0]
  dt = time.time() - t0
  cpu = time.process_time() - c0
  return toks / dt, exs / dt, toks / cpu


def pretokenized(config, tok, workdir: str):
  """The bench corpus's shards for `tok` (made once per tokenizer), and
  what making them cost: tokens, wall and CPU seconds (this process and its
  workers), workers."""
  out = os.path.join(workdir, f"shards-{tok.kind}")
  spec = tokenizer_files.TokenizerSpec(tok.kind, tok.path, tok.lower_case)
  if tf.io.gfile.exists(out):
    tf.io.gfile.rmtree(out)
  workers = num_cores()
  usage = lambda: sum(
      r.ru_utime + r.ru_stime for r in (
          resource.getrusage(resource.RUSAGE_SELF),
          resource.getrusage(resource.RUSAGE_CHILDREN)))
  c0, t0 = usage(), time.time()
  manifest = pretokenizing.write_shards(config.data, spec, out, workers)
  return out, dict(tokens=manifest.tokens, seconds=time.time() - t0,
                   cpu_seconds=usage() - c0, workers=workers)


def main(argv):
  del argv
  config = FLAGS.config or config_lib.get_config("base")
  wd = FLAGS.workdir
  glob = write_corpus(wd, FLAGS.copies)
  config.data.train_files = glob
  config.data.sources = ""
  cores = num_cores()
  rows = []
  for kind in FLAGS.kinds:
    config.data.tokenizer_type = kind
    config.data.tokenizer_path = ""
    config.data.tokenizer_vocab_size = FLAGS.vocab_size
    config.data.tokenizer_train_sentences = 200_000
    tok = tokenizers.load_tokenizer(config.data, wd)
    config.model.vocab_size = max(config.model.vocab_size, tok.vocab_size)
    config_checks.check_tokenizer(config, tok)

    # (a) Whole pipeline, masking in the tf.data graph.
    it = pipeline.create_train_iterator(config, tok, wd)
    rows.append((kind, "tf.data + in-graph masking",
                 *measure(it, FLAGS.seconds)))

    # (b) Same examples, masked on the host with numpy (HF collator style).
    ds = pipeline.example_dataset(config, tok, data_sources.plan(config.data, wd))
    ds = ds.shuffle(config.data.shuffle_buffer, seed=0).batch(
        config.train.batch_size, drop_remainder=True).prefetch(2)
    table = np.zeros(tok.vocab_size, bool)
    table[tok.special_ids] = True
    rng = np.random.default_rng(0)

    def host_mask(b):
      b = {k: v.numpy() for k, v in b.items()}
      b["input_ids"], b["labels"] = numpy_mask_batch(
          b["input_ids"], rng, special_mask_table=table, mask_id=tok.mask_id,
          vocab_size=tok.vocab_size, mask_rate=config.data.mask_rate)
      return b
    rows.append((kind, "tf.data + host numpy masking",
                 *measure(ds, FLAGS.seconds, host_mask)))

    # (c) The same corpus pre-tokenized once; the run reads the shards.
    shards, made = pretokenized(config, tok, wd)
    rows.append((kind, f"pretokenize (once, {made['workers']} procs)",
                 made["tokens"] / made["seconds"], 0.0,
                 made["tokens"] / made["cpu_seconds"]))
    from_shards = config.copy_and_resolve_references()
    from_shards.data.update(sources=f"shards:{shards}", train_files="")
    it = pipeline.create_train_iterator(from_shards, tok, wd)
    rows.append((kind, "shards + in-graph masking",
                 *measure(it, FLAGS.seconds)))

  print(f"\nInput pipeline throughput, seq_length={config.data.seq_length}, "
        f"batch={config.train.batch_size}, objective="
        f"{examples.objective(config.data)}, {cores} CPU core(s). tok/CPU-s = "
        "tokens per CPU-second used by this process (the per-core rate, "
        "robust to other load); tok/s/core = wall rate / cores.")
  rate = FLAGS.train_tokens_per_sec
  print(f"Train step consumption assumed: {rate:,.0f} tokens/s "
        "per host (--train_tokens_per_sec).")
  hdr = (f"{'tokenizer':<14}{'variant':<31}{'tokens/s':>10}{'tok/s/core':>11}"
         f"{'tok/CPU-s':>11}{'ex/CPU-s':>10}{'x train':>8}{'cores/train':>12}")
  print(hdr)
  print("-" * len(hdr))
  for kind, var, tps, eps, tpc in rows:
    per_example = f"{tpc * eps / tps:>10,.0f}" if eps else f"{'-':>10}"
    print(f"{kind:<14}{var:<31}{tps:>10,.0f}{tps / cores:>11,.0f}"
          f"{tpc:>11,.0f}{per_example}"
          f"{tps / rate:>8.2f}{rate / tpc:>12.2f}")
  print("x train = wall tokens/s / train rate; cores/train = CPU cores needed "
        "to feed the train step.")


if __name__ == "__main__":
  cli.run(main, define_flags)
