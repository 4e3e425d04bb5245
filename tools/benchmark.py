r"""Training-step throughput and MFU of bert_jax, optionally against HF peers.

  python tools/benchmark.py --config configs/small.py --steps 3 \
      --config.model.dtype=bfloat16 [--compare] [--json]

Measures the jitted train step (`steps_lib.Programs`, compiled ahead of time
as the trainer does) on synthetic batches with the config's real shapes
(global batch x seq_length, max_predictions_per_seq masked positions, varied
padding), so no input pipeline is involved. Reports tokens/s, sequences/s,
step time min / p50 / p90 / max, compile time, TFLOP/s per device, MFU
(bert_jax/models/flops.py) and peak memory. Timing: `bert_jax.benchmarking`
(warm-up steps, then alternating rounds of timed steps).

--compare runs, on the same machine with the same batches and dtype, one
training step of Hugging Face ``FlaxBertForPreTraining`` (transformers 4.57.6,
the last release with Flax models) and of PyTorch ``BertForPreTraining``
(transformers 5 + torch CPU), each in a Python with its exact pins (this one
if it has them, else a plain venv under --peer_venvs built on first use from
the requirements files; see peer_python), each as they ship: AdamW, their
own MLM head (logits at every position), dropout 0.1. Each peer lives in a
worker process (tools/bench_peer.py) fed the same synthetic batches as ours;
rounds alternate ours -> flax -> torch so machine noise hits all alike; the
first steps of each are warm-up and excluded; medians over all timed steps
are compared. bf16 means: ours ``model.dtype=bfloat16`` (bf16 matmul inputs,
f32 accumulation, f32 params), HF Flax ``dtype=jnp.bfloat16`` (its
computation dtype), PyTorch ``torch.autocast("cpu", bfloat16)``.

The family is the config's objective: a ModernBERT config
(configs/modernbert_*.py) compares against PyTorch ``ModernBertForMaskedLM``
(sdpa attention, its own sliding window; HF has no Flax ModernBERT, so
--peers=torch) twice: ``pytorch`` with ``ModernBertConfig(
sparse_prediction=True)``, MLM logits only at the masked positions as ours
and ModernBERT's own trainer compute them (the fair peer: ``vs_pytorch``),
and ``pytorch_dense``, Hugging Face's default head with logits at every
position. E.g.
  python tools/benchmark.py --config configs/modernbert_base.py --compare \
      --peers=torch --config.data.seq_length=512 \
      --config.data.max_predictions_per_seq=154 --config.train.batch_size=8

A RoBERTa or XLM-R config compares against PyTorch ``RobertaForMaskedLM`` /
``XLMRobertaForMaskedLM`` the same two ways; transformers has no option for
logits at the masked positions there, so ``pytorch`` calls the model's
encoder and ``lm_head`` on the gathered positions itself. At RoBERTa-base
shape:
  python tools/benchmark.py --config configs/roberta_base.py --compare \
      --peers=torch --config.data.seq_length=512 \
      --config.data.max_predictions_per_seq=80 --config.train.batch_size=8

Cost against sequence length: tools/bench_seq_lengths.py; ours under other
settings (fused QKV, attention kinds, logits at every position):
tools/bench_variants.py; where a step's time goes: tools/profile_step.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np
from absl import flags

from bert_jax import benchmarking
from bert_jax import cli
from bert_jax import compose
from bert_jax.training import utilization

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER_SCRIPT = os.path.join(REPO, "tools", "bench_peer.py")
FLAGS = flags.FLAGS


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file (configs/*.py) and overrides.", argv=argv,
                    lock_config=False, **define)
  cli.define_timing(**define)
  flags.DEFINE_bool("compare", False, "Also run HF Flax and PyTorch BERT "
                    "(PyTorch ModernBERT, sparse and dense MLM head, for a "
                    "ModernBERT config).", **define)
  flags.DEFINE_list("peers", ["flax", "torch"], "Peers for --compare.",
                    **define)
  flags.DEFINE_string("hf_flax_python", "", "Python for the HF Flax peer "
                      "(default: this one if it has the pins, else "
                      "<peer_venvs>/flax, created on demand).", **define)
  flags.DEFINE_string("torch_python", "", "Python for the PyTorch peer "
                      "(default: this one if it has requirements-export.txt, "
                      "else <peer_venvs>/torch, created on demand).", **define)
  flags.DEFINE_string("peer_venvs", DEFAULT_PEER_VENVS, "Where the peers' "
                      "venvs are built (plain venvs pinned from the "
                      "requirements files).", **define)
  flags.DEFINE_bool("json", False, "Print one JSON object.", **define)


# ==============================================================================
# Peers: worker processes (tools/bench_peer.py) that answer "run N steps".
# ==============================================================================
class Peer:
  """A Hugging Face peer in its own process, driven step-batch by batch
  (a `benchmarking.Timed` side)."""

  def __init__(self, name: str, kind: str, python: str, spec: dict):
    self.name, self.kind, self.times = name, kind, []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error")
    self.proc = subprocess.Popen(
        [python, PEER_SCRIPT, kind, json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    self.info = self._read()
    self.max_rss_mb = 0.0

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"{self.name} peer exited with code "
                         f"{self.proc.wait()} (see its stderr above).")
    return json.loads(line)

  def run(self, n: int, record: bool = True):
    self.proc.stdin.write(f"{n}\n")
    self.proc.stdin.flush()
    out = self._read()
    self.max_rss_mb = out["max_rss_mb"]
    if record:
      self.times += out["times"]

  def close(self):
    self.proc.stdin.close()
    self.proc.wait()


def write_batches(path: str, batches: list[dict]) -> None:
  """The batches ours trains on, for the peers (tools/bench_peer.py)."""
  np.savez(path, **{f"{i}/{k}": v for i, b in enumerate(batches)
                    for k, v in b.items()})


def peer_specs(family: str, peers, hf_config: dict, dtype: str,
               batches: str) -> list[tuple[str, str, dict]]:
  """(result key, peer kind, spec) of each peer to run."""
  base = dict(bert_config=hf_config, family=family, dtype=dtype,
              batches=batches)
  out = []
  if "flax" in peers:
    out.append(("hf_flax", "flax", base))
  if "torch" in peers:
    if family in ("modernbert", "roberta", "xlm-roberta"):
      # The fair peer (logits at the masked positions) first, then HF's
      # default head.
      out.append(("pytorch", "torch", dict(base, sparse_prediction=True)))
      out.append(("pytorch_dense", "torch",
                  dict(base, sparse_prediction=False)))
    else:
      out.append(("pytorch", "torch", base))
  return out


# ==============================================================================
# Peer environments: pinned from the repo's requirements files, built on demand.
# ==============================================================================
# kind -> ((requirements file, the names taken from it or None for all), ...).
# HF Flax: transformers 4.57.6 (the last with Flax models) cannot live beside
# requirements.txt's tokenizers, so its venv takes only the JAX stack from
# requirements.txt and lets pip pick tokenizers. PyTorch: the export stack.
PEER_REQUIREMENTS = {
    "flax": (("requirements.txt", ("jax", "jaxlib", "flax", "optax", "numpy")),
             ("requirements-bench.txt", None)),
    "torch": (("requirements.txt", ("numpy",)),
              ("requirements-export.txt", None)),
}
DEFAULT_PEER_VENVS = os.path.join(REPO, ".venv-bench")  # One venv per kind.

# Run by a candidate Python with the pins as arguments: exits 0 iff it has
# every pinned version (a local label such as torch's "+cpu" is ignored).
_HAS_PINS = """
import importlib.metadata as md, sys
bad = []
for pin in sys.argv[1:]:
  name, want = pin.split("==")
  try:
    have = md.version(name).split("+")[0]
  except md.PackageNotFoundError:
    have = None
  if have != want:
    bad.append(f"{name} {have} (want {want})")
sys.exit("; ".join(bad) or None)
"""


def peer_pins(kind: str) -> list[str]:
  """The `name==version` lines a peer needs, read from requirements files."""
  pins = []
  for filename, names in PEER_REQUIREMENTS[kind]:
    with open(os.path.join(REPO, filename)) as f:
      for line in f:
        pin = line.split("#")[0].strip()
        if not pin or (names and pin.split("==")[0].lower() not in names):
          continue
        if pin.count("==") != 1:
          raise ValueError(f"{filename}: {pin!r} is not an exact `name==version`"
                           " pin; the benchmark peers need exact pins.")
        pins.append(pin)
  return pins


def _has_pins(python: str, pins: list[str]) -> bool:
  return os.path.exists(python) and subprocess.run(
      [python, "-c", _HAS_PINS, *pins], capture_output=True).returncode == 0


def peer_python(kind: str, venvs: str = DEFAULT_PEER_VENVS) -> str:
  """A Python with the peer's pins: this one if it has them, else the plain
  venv `venvs`/`kind`, (re)built on first use.

  Plain, not --system-site-packages: from inside a venv that flag exposes the
  base interpreter's packages, not this venv's, so the peer would miss jax.
  """
  pins = peer_pins(kind)
  if _has_pins(sys.executable, pins):
    return sys.executable
  path = os.path.join(venvs, kind)
  python = os.path.join(path, "bin", "python")
  if _has_pins(python, pins):
    return python
  print(f"Creating {path} for the {kind} peer: {' '.join(pins)} "
        "(once; a few minutes) ...", file=sys.stderr, flush=True)
  subprocess.run([sys.executable, "-m", "venv", "--clear", path], check=True)
  subprocess.run([python, "-m", "pip", "install", "-q", *pins], check=True)
  result = subprocess.run([python, "-c", _HAS_PINS, *pins],
                          capture_output=True, text=True)
  if result.returncode:
    raise RuntimeError(f"{path} lacks the {kind} peer's pins after "
                       f"installing them: {result.stderr.strip()}")
  return python


# ==============================================================================
# Benchmark.
# ==============================================================================
def benchmark(config, steps: int, rounds: int, warmup: int, compare: bool,
              flax_python: str | None = None, peers=("flax", "torch"),
              torch_python: str | None = None,
              peer_venvs: str = DEFAULT_PEER_VENVS) -> dict:
  family = compose.family(config).name
  if compare and family != "bert" and "flax" in peers:
    raise ValueError(f"--compare --peers=flax: Hugging Face has no Flax "
                     f"model of the {family!r} family; use --peers=torch.")
  b, t = config.train.batch_size, config.data.seq_length
  dtype = config.model.dtype
  tokens_per_step = b * t
  peak, peak_source = utilization.peak_tflops(dtype, config.train.peak_tflops)
  ours = benchmarking.Ours(config)
  sides = [ours]
  with tempfile.TemporaryDirectory() as tmp:
    if compare:
      path = os.path.join(tmp, "batches.npz")
      write_batches(path, ours.host_batches)
      hf_config = compose.family(config).pretraining_tables[0].config_to_hf(
          config.model)
      for name, kind, spec in peer_specs(family, peers, hf_config, dtype,
                                         path):
        python = ((flax_python if kind == "flax" else torch_python)
                  or peer_python(kind, peer_venvs))
        sides.append(Peer(name, kind, python, spec))
    measured_peak = peak_source.startswith("measured")

    def remeasure_peak():  # The machine's best: re-measured between rounds.
      nonlocal peak
      if measured_peak:
        peak = max(peak, utilization.measure_matmul_tflops(dtype, cache=False))

    try:
      benchmarking.alternate(sides, warmup=warmup, rounds=rounds, steps=steps,
                             between_rounds=remeasure_peak)
    finally:
      for peer in sides[1:]:
        peer.close()

  flops_per_step = compose.train_flops_per_step(config)
  st = benchmarking.stats(ours.times)
  tflops, mfu = utilization.mfu(flops_per_step, st["p50"], jax.device_count(),
                                peak)
  result = dict(
      config=dict(family=family, layers=config.model.num_hidden_layers,
                  hidden=config.model.hidden_size,
                  vocab=config.model.vocab_size, seq_length=t, batch_size=b,
                  max_predictions_per_seq=config.data.max_predictions_per_seq,
                  dtype=dtype,
                  attention_impl=config.model.get("attention_impl", "xla"),
                  fused_qkv=bool(config.model.get("fused_qkv", False)),
                  remat_policy=config.model.get("remat_policy", "none"),
                  attention_dropout=config.model.attention_probs_dropout_prob),
      backend=jax.default_backend(), devices=jax.device_count(),
      device_kind=jax.devices()[0].device_kind,
      tokens_per_sec=tokens_per_step / st["p50"],
      sequences_per_sec=b / st["p50"],
      step_time_min=st["min"], step_time_p50=st["p50"],
      step_time_p90=st["p90"], step_time_max=st["max"], timed_steps=st["n"],
      compile_seconds=ours.compile_seconds,
      train_tflops_per_step=flops_per_step / 1e12,
      tflops_per_device=tflops, mfu=mfu, peak_tflops=peak,
      peak_source=peak_source, peak_memory_mb=ours.memory_mb,
      max_rss_mb=benchmarking.max_rss_mb())
  for peer in sides[1:]:
    pst = benchmarking.stats(peer.times)
    result[peer.name] = dict(
        tokens_per_sec=tokens_per_step / pst["p50"],
        step_time_min=pst["min"], step_time_p50=pst["p50"],
        step_time_p90=pst["p90"], step_time_max=pst["max"],
        timed_steps=pst["n"], compile_seconds=peer.info["compile_seconds"],
        max_rss_mb=peer.max_rss_mb, framework=peer.info["framework"],
        mlm_logits=PEER_HEADS.get((family, peer.name), "every position"))
    result[f"vs_{peer.name}"] = (result["tokens_per_sec"]
                                 / result[peer.name]["tokens_per_sec"])
  return result


# What each peer's MLM head computes, as the report states it.
PEER_HEADS = {
    ("bert", "hf_flax"): "every position (HF's head)",
    ("bert", "pytorch"): "every position (HF's head)",
    ("modernbert", "pytorch"): "masked positions only (sparse_prediction=True, "
                               "as ModernBERT's own trainer)",
    ("modernbert", "pytorch_dense"): "every position (HF's default head)",
    **{(f, "pytorch"): "masked positions only (the model's encoder and "
                       "lm_head called on the gathered positions: "
                       "transformers has no option for it)"
       for f in ("roberta", "xlm-roberta")},
    **{(f, "pytorch_dense"): "every position (HF's RobertaForMaskedLM)"
       for f in ("roberta", "xlm-roberta")},
}


def print_human(r: dict):
  c = r["config"]
  print(f"bert_jax {c['family']} {c['layers']}x{c['hidden']} vocab "
        f"{c['vocab']}, batch "
        f"{c['batch_size']} x seq {c['seq_length']}, {c['dtype']}, attention "
        f"{c['attention_impl']}, fused_qkv {c['fused_qkv']}, remat "
        f"{c['remat_policy']} on {r['devices']} {r['device_kind']}; MLM "
        "logits at the masked positions only")
  mem = ("n/a" if r["peak_memory_mb"] is None
         else f"{r['peak_memory_mb']:.0f} MB")
  print(f"  tokens/s {r['tokens_per_sec']:.0f}  sequences/s "
        f"{r['sequences_per_sec']:.1f}  step min / p50 / p90 / max "
        f"{r['step_time_min']*1e3:.0f} / {r['step_time_p50']*1e3:.0f} / "
        f"{r['step_time_p90']*1e3:.0f} / {r['step_time_max']*1e3:.0f} ms  "
        f"compile {r['compile_seconds']:.1f} s  ({r['timed_steps']} steps)")
  print(f"  {r['tflops_per_device']:.3f} TFLOP/s per device  MFU "
        f"{100*r['mfu']:.1f}% of {r['peak_tflops']:.2f} TFLOP/s "
        f"({r['peak_source']})  step memory {mem}  max RSS "
        f"{r['max_rss_mb']:.0f} MB")
  for name in ("hf_flax", "pytorch", "pytorch_dense"):
    if name in r:
      p = r[name]
      print(f"  {name:13s} tokens/s {p['tokens_per_sec']:.0f}  step p50 "
            f"{p['step_time_p50']*1e3:.0f} ms  ({p['framework']}; MLM logits "
            f"at {p['mlm_logits']})  -> ours is {r['vs_' + name]:.2f}x")


def main(argv):
  del argv
  r = benchmark(FLAGS.config, FLAGS.steps, FLAGS.rounds, FLAGS.warmup,
                FLAGS.compare, FLAGS.hf_flax_python or None,
                tuple(FLAGS.peers), FLAGS.torch_python or None,
                FLAGS.peer_venvs)
  if FLAGS.json:
    print(json.dumps(r))
  else:
    print_human(r)


if __name__ == "__main__":
  cli.run(main, define_flags)
