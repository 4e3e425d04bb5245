r"""How a train step's cost grows with sequence length, at equal tokens per
batch, against the FLOP count's prediction.

  python tools/bench_seq_lengths.py --config configs/demo.py \
      --seq_lengths 64,128,256,512 [--tokens_per_batch 4096] \
      [--attention xla,dot_product_attention] [--json]

For each length: batch = tokens / length, predictions per token kept as in
the config, the position table widened to the longest length; with XLA
attention and each fused kind that runs on this backend (the others are
listed as such). All cells compile first, then alternate, `--steps` timed
steps each for `--rounds` rounds after `--warmup` untimed ones
(`bert_jax.benchmarking`). Prints per-token step time against the analytic
FLOP count's prediction (models/flops.py: the 12 L T d attention term grows
with T), both as ratios to the first row.

--baseline_config alternates a second model in the same run (its cells
carry "model": "baseline", ratios per model), e.g. ModernBERT's local +
global attention against BERT's full attention:
  python tools/bench_seq_lengths.py --config configs/modernbert_base.py \
      --baseline_config configs/base.py --seq_lengths 512,1024,2048,4096,8192 \
      --tokens_per_batch 8192
"""

from __future__ import annotations

import json

import jax
from absl import flags
from ml_collections import config_flags

from bert_jax import benchmarking
from bert_jax import cli
from bert_jax import compose
from bert_jax.training import utilization

FLAGS = flags.FLAGS

# Fused attention kinds and the backends they run on ("xla" runs anywhere).
ATTENTION_BACKENDS = {"dot_product_attention": ("cpu", "gpu", "tpu"),
                      "cudnn": ("gpu",), "splash": ("tpu",)}


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file (configs/*.py) and overrides.", argv=argv,
                    lock_config=False, **define)
  config_flags.DEFINE_config_file(
      "baseline_config", None, "A second model whose cells alternate with "
      "the config's (e.g. configs/base.py).", lock_config=False,
      sys_argv=argv, **define)
  flags.DEFINE_list("seq_lengths", ["64", "128", "256", "512"],
                    "Sequence lengths, at equal tokens per batch.", **define)
  flags.DEFINE_integer("tokens_per_batch", 0, "Tokens per batch (default: "
                       "the config's batch x seq).", **define)
  flags.DEFINE_list("attention", ["xla", "dot_product_attention", "cudnn",
                                  "splash"], "Attention kinds (those that "
                    "cannot run on this backend are listed as such).",
                    **define)
  cli.define_timing(**define)
  flags.DEFINE_bool("json", False, "Print one JSON list.", **define)


def seq_length_configs(config, seq_lengths: list[int], tokens: int,
                       attention: list[str], backend: str) -> list:
  """(seq, kind, config or None if it cannot run here) per measured cell."""
  base_t, base_p = config.data.seq_length, config.data.max_predictions_per_seq
  cells = []
  for t in seq_lengths:
    if tokens % t:
      raise ValueError(f"--tokens_per_batch={tokens} is not divisible by "
                       f"sequence length {t}: pick a multiple of every one.")
    for kind in attention:
      runs_here = kind == "xla" or backend in ATTENTION_BACKENDS.get(kind, ())
      if kind == "splash" and t % 128:
        runs_here = False
      if not runs_here:
        cells.append((t, kind, None))
        continue
      c = config.copy_and_resolve_references()
      c.data.seq_length = t
      c.train.batch_size = tokens // t
      c.data.max_predictions_per_seq = max(1, round(base_p * t / base_t))
      c.model.max_position_embeddings = max(c.model.max_position_embeddings,
                                            max(seq_lengths))
      c.model.attention_impl = kind
      if kind != "xla":  # The fused kernels have no attention dropout.
        c.model.attention_probs_dropout_prob = 0.0
      cells.append((t, kind, c))
  return cells


def compare_seq_lengths(config, seq_lengths: list[int], tokens: int,
                        attention: list[str], steps: int, rounds: int,
                        warmup: int, baseline=None) -> list[dict]:
  """Per-token step time per (length, attention kind) vs the objective's
  FLOP count; with a `baseline` config its cells alternate with ours
  (rows carry "model": "config" / "baseline", ratios per model)."""
  cells = [("config", *cell) for cell in seq_length_configs(
      config, seq_lengths, tokens, attention, jax.default_backend())]
  if baseline is not None:
    cells += [("baseline", *cell) for cell in seq_length_configs(
        baseline, seq_lengths, tokens, attention, jax.default_backend())]
  runners = [(m, t, kind, c, benchmarking.Ours(c) if c is not None else None)
             for m, t, kind, c in cells]
  benchmarking.alternate([r for *_, r in runners if r is not None],
                         warmup=warmup, rounds=rounds, steps=steps)
  rows, firsts = [], {}
  for name, t, kind, c, r in runners:
    if r is None:
      rows.append(dict(model=name, seq_length=t, attention=kind, runs=False))
      continue
    p50 = benchmarking.stats(r.times)["p50"]
    fpt = compose.train_flops_per_step(c) / (c.train.batch_size * t)
    peak, _ = utilization.peak_tflops(c.model.dtype, c.train.peak_tflops)
    _, mfu = utilization.mfu(compose.train_flops_per_step(c), p50,
                             jax.device_count(), peak)
    row = dict(model=name, seq_length=t, attention=kind, runs=True,
               batch_size=c.train.batch_size,
               max_predictions_per_seq=c.data.max_predictions_per_seq,
               step_time_p50=p50, us_per_token=1e6 * p50 / tokens,
               flops_per_token=fpt, mfu=mfu,
               compile_seconds=r.compile_seconds, peak_memory_mb=r.memory_mb)
    first = firsts.setdefault(name, row)  # Shortest length, first kind.
    row["time_ratio"] = row["us_per_token"] / first["us_per_token"]
    row["flops_ratio"] = fpt / first["flops_per_token"]
    rows.append(row)
  return rows


def print_seq_lengths(rows: list[dict], tokens: int, config):
  m = config.model
  print(f"bert_jax {m.num_hidden_layers}x{m.hidden_size} vocab "
        f"{m.vocab_size}, {m.dtype}, on {jax.device_count()} "
        f"{jax.devices()[0].device_kind}; tokens per batch {tokens}; ratios "
        "are per token against the first row (measured step time vs the "
        "FLOP count of models/flops.py)")
  print(f"{'model':8s} {'seq':>5} {'attention':22s} {'batch':>5} "
        f"{'preds':>5} {'step ms':>8} {'us/token':>8} {'x time':>7} "
        f"{'MFLOP/tok':>9} {'x flops':>7} {'MFU':>6} {'compile s':>9}")
  for r in rows:
    if not r["runs"]:
      print(f"{r['model']:8s} {r['seq_length']:>5} {r['attention']:22s} does "
            "not run on this backend / length")
      continue
    print(f"{r['model']:8s} {r['seq_length']:>5} {r['attention']:22s} "
          f"{r['batch_size']:>5} "
          f"{r['max_predictions_per_seq']:>5} {1e3*r['step_time_p50']:>8.1f} "
          f"{r['us_per_token']:>8.2f} {r['time_ratio']:>7.2f} "
          f"{r['flops_per_token']/1e6:>9.2f} {r['flops_ratio']:>7.2f} "
          f"{100*r['mfu']:>5.1f}% {r['compile_seconds']:>9.1f}")


def main(argv):
  del argv
  config = FLAGS.config
  tokens = FLAGS.tokens_per_batch or (config.train.batch_size
                                      * config.data.seq_length)
  rows = compare_seq_lengths(config, [int(t) for t in FLAGS.seq_lengths],
                             tokens, list(FLAGS.attention), FLAGS.steps,
                             FLAGS.rounds, FLAGS.warmup, FLAGS.baseline_config)
  if FLAGS.json:
    print(json.dumps(rows))
  else:
    print_seq_lengths(rows, tokens, config)


if __name__ == "__main__":
  cli.run(main, define_flags)
