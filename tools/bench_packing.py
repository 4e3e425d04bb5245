r"""Pretraining throughput on packed vs padded rows, side by side.

  python tools/bench_packing.py --config configs/mini.py \
      --seq_lengths 128,512 --workdir /tmp/bench_packing \
      [--config.model.dtype=bfloat16 --rounds 3 --steps 5 --warmup 2]

For each sequence length, two runs of the same config on the same data (the
demo corpus unless data.sources says otherwise, tokenizer trained once and
cached in --workdir): `data.packing=False` (one example a row, padded) and
`data.packing=True` (several examples a row, attention inside each,
bert_jax/data/packing.py). Both sides' batches are made by the real input
pipeline before timing (`--batches` each; the pipeline's own speed is
tools/bench_input.py's); then the two compiled train steps alternate,
`--steps` steps each for `--rounds` rounds, after `--warmup` untimed steps
(`bert_jax.benchmarking`).

Reported per side: real (non-padding) tokens/s, the packing efficiency of
its batches (real tokens / row slots), examples/s (pairs or chunks trained
on), the median step time and MFU on the real work (real tokens, each
example's own attention, the real masked positions; models/flops.py), and
packed / padded real tokens/s. max_predictions_per_seq is
`--predictions_per_token` x seq_length unless given (BERT: 20 at 128, 80 at
512). Not a test: numbers depend on the machine and its load (printed).
"""

from __future__ import annotations

import os

import jax
import numpy as np
from absl import flags

from bert_jax import benchmarking
from bert_jax import cli
from bert_jax import config_lib
from bert_jax import compose
from bert_jax.data import pipeline
from bert_jax.data import tokenizers
from bert_jax.models import flops as flops_lib
from bert_jax.training import compiled
from bert_jax.training import config_checks
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from bert_jax.training import utilization


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file (configs/*.py).", argv=argv, **define)
  flags.DEFINE_list("seq_lengths", ["128", "512"], "Sequence lengths "
                    "compared.", **define)
  flags.DEFINE_float("predictions_per_token", 0.16, "max_predictions_per_seq "
                     "= round(this x seq_length) (BERT: 20/128, 80/512).",
                     **define)
  flags.DEFINE_integer("batches", 8, "Pipeline batches made per side.",
                       **define)
  cli.define_timing(steps=4, rounds=3, warmup=2, **define)
  cli.define_workdir("Tokenizer and demo corpus cache.",
                     default="/tmp/bench_packing", **define)
  flags.DEFINE_string("json", "", "Also write the results to this file.",
                      **define)


FLAGS = flags.FLAGS


def side_config(config, seq_length: int, predictions: int, packing: bool):
  c = config.copy_and_resolve_references()
  c.data.update(seq_length=seq_length, max_predictions_per_seq=predictions,
                packing=packing)
  c.model.max_position_embeddings = max(c.model.max_position_embeddings,
                                        seq_length)
  return c


class Side(benchmarking.Side):
  """One config's compiled train step on its pipeline's batches; each timed
  step keeps its work (real tokens, attended pairs, predictions)."""

  def __init__(self, name, config, tok, workdir, num_batches):
    super().__init__(num_batches)
    config_checks.validate(config, jax.device_count(), jax.process_count())
    self.name, self.config = name, config
    it = pipeline.create_train_iterator(config, tok, workdir)
    host = [next(it) for _ in range(num_batches)]
    self.real = [int(b["input_mask"].sum()) for b in host]
    self.slots = [int(b["input_mask"].size) for b in host]
    self.examples = [int(b["next_sentence_weights"].sum())
                     if "next_sentence_weights" in b else len(b["input_ids"])
                     for b in host]
    self.programs = p = steps_lib.Programs(config,
                                           sharding.make_mesh(config.mesh))
    with p.context():
      self.state = p.init()
      self.device_batches = [sharding.global_batch(b, p.batch_sharding)
                             for b in host]
      self.step_fn = compiled.compile_ahead(
          p.train_step, p.abstract_state,
          p.batch_spec(config.train.batch_size))
    self.compile_seconds = self.step_fn.seconds

  def step(self, k: int):
    self.state, metrics = self.step_fn(self.state, self.device_batches[k])
    return jax.device_get(metrics["work"])

  def summary(self, peak: float) -> dict:
    r = np.asarray([(dt, self.real[k], self.slots[k], self.examples[k])
                    for dt, k in zip(self.times, self.batches)], np.float64)
    secs = r[:, 0].sum()
    total = {k: float(sum(w[k] for w in self.outputs))
             for k in self.outputs[0]}
    flops = compose.train_flops_per_step(self.config, flops_lib.Work(
        total["tokens"], total["attended"], total["predictions"]))
    tflops, mfu = utilization.mfu(flops, secs, jax.device_count(), peak)
    return dict(side=self.name, steps=len(r), seconds=float(secs),
                real_tokens_per_s=float(r[:, 1].sum() / secs),
                slots_per_s=float(r[:, 2].sum() / secs),
                packing_efficiency=float(r[:, 1].sum() / r[:, 2].sum()),
                examples_per_s=float(r[:, 3].sum() / secs),
                step_ms_p50=float(1e3 * np.median(r[:, 0])),
                tflops_per_device=tflops, mfu=mfu,
                compile_seconds=self.compile_seconds)


def benchmark(config, seq_lengths, predictions_per_token: float,
              num_batches: int, rounds: int, steps: int, warmup: int,
              workdir: str) -> dict:
  tok = tokenizers.load_tokenizer(config.data, workdir)
  peak, peak_source = utilization.peak_tflops(config.model.dtype,
                                              config.train.peak_tflops)
  rows = []
  for t in seq_lengths:
    p = max(1, int(round(predictions_per_token * t)))
    sides = [Side(name, side_config(config, t, p, packing), tok, workdir,
                  num_batches)
             for name, packing in (("padded", False), ("packed", True))]
    benchmarking.alternate(sides, warmup=warmup, rounds=rounds, steps=steps)
    pad, packed = (s.summary(peak) for s in sides)
    rows.append(dict(seq_length=t, max_predictions_per_seq=p, padded=pad,
                     packed=packed, packed_over_padded=packed[
                         "real_tokens_per_s"] / pad["real_tokens_per_s"]))
  m, d = config.model, config.data
  return dict(
      model=f"{m.num_hidden_layers}x{m.hidden_size} ({m.num_attention_heads} "
      f"heads, vocab {m.vocab_size}, {m.attention_impl})", dtype=m.dtype,
      objective=f"{config.objective.name}/{config_lib.sentence_objective(d)}",
      data=d.sources or d.train_files or "demo corpus",
      batch_size=config.train.batch_size,
      packing_max_sequences=d.packing_max_sequences,
      packing_window=d.packing_window, rounds=rounds, steps=steps,
      warmup=warmup, batches=num_batches, peak_tflops=peak,
      peak_source=peak_source,
      versions=f"jax {jax.__version__} ({jax.devices()[0].platform}, "
      f"{jax.device_count()} devices)",
      cpu_count=os.cpu_count(), load_average=list(os.getloadavg()),
      results=rows)


def format_report(r: dict) -> str:
  lines = [
      f"Pretraining throughput, packed vs padded rows: model {r['model']}, "
      f"{r['dtype']}, objective {r['objective']}, data {r['data']}, batch "
      f"{r['batch_size']} rows, packing_max_sequences "
      f"{r['packing_max_sequences']}, window {r['packing_window']}; "
      f"{r['rounds']} rounds x {r['steps']} steps per side, alternating, "
      f"after {r['warmup']} warm-up steps, {r['batches']} pipeline batches "
      f"per side; peak {r['peak_tflops']:.1f} TFLOP/s ({r['peak_source']}); "
      f"load average {', '.join(f'{x:.1f}' for x in r['load_average'])} on "
      f"{r['cpu_count']} CPUs; {r['versions']}.",
      f"{'seq':>4} {'side':<7} {'real tok/s':>10} {'packing':>8} "
      f"{'examples/s':>10} {'p50 ms':>8} {'MFU':>6}"]
  for row in r["results"]:
    for key in ("padded", "packed"):
      s = row[key]
      lines.append(
          f"{row['seq_length']:>4} {key:<7} {s['real_tokens_per_s']:>10.0f} "
          f"{100 * s['packing_efficiency']:>7.1f}% "
          f"{s['examples_per_s']:>10.1f} {s['step_ms_p50']:>8.1f} "
          f"{100 * s['mfu']:>5.1f}%")
    lines.append(f"{row['seq_length']:>4} packed / padded real tokens/s: "
                 f"{row['packed_over_padded']:.2f}x")
  return "\n".join(lines)


def main(argv):
  del argv
  benchmarking.report(
      lambda: benchmark(FLAGS.config, [int(s) for s in FLAGS.seq_lengths],
                        FLAGS.predictions_per_token, FLAGS.batches,
                        FLAGS.rounds, FLAGS.steps, FLAGS.warmup,
                        FLAGS.workdir),
      format_report, FLAGS.json)


if __name__ == "__main__":
  cli.run(main, define_flags)
