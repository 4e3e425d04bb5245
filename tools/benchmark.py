r"""Training-step throughput and MFU of bert_jax, optionally against HF peers.

  python tools/benchmark.py --config configs/small.py --steps 3 \
      --config.model.dtype=bfloat16 [--compare] [--json]

Measures the jitted train step (`steps_lib.Programs`) on synthetic batches with
the config's real shapes (global batch x seq_length, max_predictions_per_seq
masked positions, varied padding), so no input pipeline is involved. Reports
tokens/s, sequences/s, step time p50/p90, compile time, TFLOP/s per device,
MFU (bert_jax/models/flops.py) and peak memory.

--seq_lengths 64,128,256,512 measures how cost grows with length: at the
same tokens per batch (batch = tokens / seq, predictions per token kept as
in the config, the position table widened to the longest length) with XLA
attention and each fused kind that runs on this backend, alternating, it
prints per-token step time against the analytic FLOP count's prediction
(models/flops.py: the 12 L T d attention term grows with T).

--compare runs, on the same machine with the same batch shape and dtype, one
training step of Hugging Face ``FlaxBertForPreTraining`` (transformers 4.57.6,
the last release with Flax models) and of PyTorch ``BertForPreTraining``
(transformers 5 + torch CPU), each in a Python with its exact pins (this one
if it has them, else a plain venv under --peer_venvs built on first use from
the requirements files; see peer_python), each as they ship: AdamW, their
own MLM head (logits at every position), dropout 0.1. Each peer lives in a
worker process; rounds alternate ours -> flax -> torch so machine noise hits
all alike; the first steps of each are warm-up and excluded; medians over all
timed steps are compared. bf16 means: ours
``model.dtype=bfloat16`` (bf16 matmul inputs, f32 accumulation, f32 params),
HF Flax ``dtype=jnp.bfloat16`` (its computation dtype), PyTorch
``torch.autocast("cpu", bfloat16)``.

The family is the config's objective: a ModernBERT config
(configs/modernbert_*.py) compares against PyTorch ``ModernBertForMaskedLM``
(sdpa attention, its own sliding window; HF has no Flax ModernBERT, so
--peers=torch), e.g.
  python tools/benchmark.py --config configs/modernbert_base.py --compare \
      --peers=torch --config.data.seq_length=512 \
      --config.data.max_predictions_per_seq=154 --config.train.batch_size=8
--seq_lengths with --baseline_config configs/base.py alternates a second
model (BERT's full attention) in the same run: per-token cost growth of
local + global against full attention, e.g. 512,1024,2048,4096,8192 at
--tokens_per_batch=8192 (ratios are against each model's first row).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ==============================================================================
# Synthetic batches (numpy; shared by ours and the peers).
# ==============================================================================
def synthetic_batches(num: int, batch: int, seq: int, preds: int, vocab: int,
                      seed: int = 0) -> list[dict]:
  """`num` different batches in google-research/bert feature layout.

  Lengths vary per row (trailing padding), masked positions are distinct real
  tokens (the last rows' slots may be padding with weight 0), as real data.
  """
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(num):
    lengths = rng.integers(seq // 2, seq + 1, size=batch)
    lengths[0] = seq
    pos = np.arange(seq)[None]
    mask = (pos < lengths[:, None]).astype(np.int32)
    ids = rng.integers(5, vocab, size=(batch, seq)).astype(np.int32) * mask
    seg = ((pos >= lengths[:, None] // 2) & (mask > 0)).astype(np.int32)
    positions = np.zeros((batch, preds), np.int32)
    weights = np.zeros((batch, preds), np.float32)
    for i, n in enumerate(lengths):
      k = min(preds, max(1, int(round(0.15 * n))))
      positions[i, :k] = np.sort(rng.choice(np.arange(1, n), k, replace=False))
      weights[i, :k] = 1.0
    out.append(dict(
        input_ids=ids, input_mask=mask, segment_ids=seg,
        masked_lm_positions=positions,
        masked_lm_ids=rng.integers(5, vocab, size=(batch, preds)).astype(
            np.int32),
        masked_lm_weights=weights,
        next_sentence_labels=rng.integers(0, 2, size=batch).astype(np.int32)))
  return out


def _labels_full(b: dict) -> np.ndarray:
  """[B,T] MLM labels with -100 at unmasked positions (HF convention)."""
  labels = np.full(b["input_ids"].shape, -100, np.int64)
  for i in range(labels.shape[0]):
    for p, t, w in zip(b["masked_lm_positions"][i], b["masked_lm_ids"][i],
                       b["masked_lm_weights"][i]):
      if w > 0:
        labels[i, p] = t
  return labels


def _stats(times: list[float]) -> dict:
  a = np.asarray(times)
  return dict(p50=float(np.median(a)), p90=float(np.percentile(a, 90)),
              mean=float(a.mean()), n=len(times))


def _max_rss_mb() -> float:
  import resource
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ==============================================================================
# Peers: worker processes that answer "run N steps" on stdin with timings.
# ==============================================================================
def _peer_torch(spec: dict):
  import torch
  import transformers

  torch.manual_seed(0)
  modern = spec.get("family") == "modernbert"
  if modern:  # MLM only; sdpa with its own masks (local + global).
    cfg = transformers.ModernBertConfig(**{
        k: v for k, v in spec["bert_config"].items()
        if k not in ("architectures", "model_type", "dtype")})
    model = transformers.ModernBertForMaskedLM._from_config(
        cfg, attn_implementation="sdpa").train()
  else:
    cfg = transformers.BertConfig(**spec["bert_config"])
    model = transformers.BertForPreTraining(cfg).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  bf16 = spec["dtype"] == "bfloat16"
  batches = []
  for b in synthetic_batches(**spec["data"]):
    batch = dict(
        input_ids=torch.from_numpy(b["input_ids"]).long(),
        attention_mask=torch.from_numpy(b["input_mask"]).long(),
        labels=torch.from_numpy(_labels_full(b)))
    if not modern:
      batch.update(
          token_type_ids=torch.from_numpy(b["segment_ids"]).long(),
          next_sentence_label=torch.from_numpy(
              b["next_sentence_labels"]).long())
    batches.append(batch)

  def step(b):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
      loss = model(**b).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())

  return step, batches, dict(framework=f"torch {torch.__version__}, "
                             f"transformers {transformers.__version__}",
                             threads=torch.get_num_threads())


def _peer_flax(spec: dict):
  import jax
  import jax.numpy as jnp
  import optax
  import transformers
  from transformers import FlaxBertForPreTraining

  cfg = transformers.BertConfig(**spec["bert_config"])
  dtype = jnp.bfloat16 if spec["dtype"] == "bfloat16" else jnp.float32
  model = FlaxBertForPreTraining(cfg, seed=0, dtype=dtype)
  tx = optax.adamw(1e-4, weight_decay=0.01)
  params = model.params
  opt_state = tx.init(params)

  def loss_fn(params, b, rng):
    out = model(b["input_ids"], attention_mask=b["attention_mask"],
                token_type_ids=b["token_type_ids"], params=params,
                dropout_rng=rng, train=True)
    logits = out.prediction_logits.astype(jnp.float32)  # [B, T, V]
    labels = b["labels"]
    w = (labels >= 0).astype(jnp.float32)
    nll = optax.softmax_cross_entropy_with_integer_labels(
        logits, jnp.maximum(labels, 0))
    mlm = jnp.sum(nll * w) / jnp.maximum(jnp.sum(w), 1.0)
    nsp = optax.softmax_cross_entropy_with_integer_labels(
        out.seq_relationship_logits.astype(jnp.float32),
        b["next_sentence_label"]).mean()
    return mlm + nsp

  @jax.jit
  def train_step(params, opt_state, b, rng):
    rng, sub = jax.random.split(rng)
    loss, grads = jax.value_and_grad(loss_fn)(params, b, sub)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, rng

  state = dict(params=params, opt_state=opt_state,
               rng=jax.random.key(0))
  batches = []
  for b in synthetic_batches(**spec["data"]):
    batches.append(jax.device_put(dict(
        input_ids=b["input_ids"], attention_mask=b["input_mask"],
        token_type_ids=b["segment_ids"], labels=_labels_full(b).astype(
            np.int32), next_sentence_label=b["next_sentence_labels"])))

  def step(b):
    state["params"], state["opt_state"], loss, state["rng"] = train_step(
        state["params"], state["opt_state"], b, state["rng"])
    return float(loss)

  return step, batches, dict(framework=f"jax {jax.__version__}, "
                             f"transformers {transformers.__version__}")


def peer_worker(kind: str, spec_json: str):
  """stdin: one integer per line (steps to time); stdout: one JSON per line."""
  spec = json.loads(spec_json)
  t0 = time.perf_counter()
  step, batches, info = (_peer_torch if kind == "torch" else _peer_flax)(spec)
  setup = time.perf_counter() - t0
  t0 = time.perf_counter()
  step(batches[0])  # First step: compile (flax) / allocator warm-up (torch).
  info.update(setup_seconds=setup, compile_seconds=time.perf_counter() - t0)
  print(json.dumps(info), flush=True)
  i = 1
  for line in sys.stdin:
    n = int(line)
    times = []
    for _ in range(n):
      t = time.perf_counter()
      step(batches[i % len(batches)])
      times.append(time.perf_counter() - t)
      i += 1
    print(json.dumps(dict(times=times, max_rss_mb=_max_rss_mb())), flush=True)


class Peer:
  """A peer implementation in its own process, driven step-batch by batch."""

  def __init__(self, kind: str, python: str, spec: dict, warmup: int):
    self.kind, self.times = kind, []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", HF_HUB_OFFLINE="1",
               TRANSFORMERS_VERBOSITY="error")
    self.proc = subprocess.Popen(
        [python, os.path.abspath(__file__), "--_peer", kind, json.dumps(spec)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    self.info = self._read()
    if warmup:
      self.run(warmup, record=False)

  def _read(self) -> dict:
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"{self.kind} peer exited with code "
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
# Ours.
# ==============================================================================
def full_logits_objective():
  """Ablation of the masked-position gather: BERT's objective with
  vocabulary logits at every position (as HF), then the masked ones picked
  for the same loss. Plugged into the train step like any objective."""
  import dataclasses

  import jax.numpy as jnp
  from flax import nnx

  from bert_jax.objectives import bert

  def loss_sums(model, batch, rng, deterministic, config):
    del config
    rngs = None if deterministic else nnx.Rngs(dropout=rng)
    out = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                None, deterministic=deterministic, rngs=rngs)
    mlm_logits = jnp.take_along_axis(
        out["mlm_logits"], batch["masked_lm_positions"][..., None], axis=1)
    return {**bert.mlm_sums(mlm_logits, batch),
            **bert.pair_sums(out["nsp_logits"], batch["next_sentence_labels"])}

  return dataclasses.replace(bert.OBJECTIVE, name="bert_full_logits",
                             loss_sums=loss_sums)


class Ours:
  """bert_jax's compiled train step on synthetic device-resident batches."""

  def __init__(self, config, warmup: int, num_batches: int = 4,
               gather: bool = True):
    import jax

    from bert_jax.training import sharding
    from bert_jax.training import steps as steps_lib

    self.jax = jax
    self.config, self.times = config, []
    self.mesh = sharding.make_mesh(config.mesh)
    from bert_jax.training import config_checks
    # The trainer's startup checks: one sentence, not a broadcasting error.
    config_checks.validate(config, jax.device_count(), jax.process_count(),
                           check_sources=False)
    objective = None if gather else full_logits_objective()
    self.programs = p = steps_lib.Programs(config, self.mesh, objective)
    b, d = config.train.batch_size, config.data
    with p.context():
      t0 = time.perf_counter()
      self.step = p.train_step.lower(p.abstract_state,
                                     p.batch_spec(b)).compile()
      self.compile_seconds = time.perf_counter() - t0
      self.state = p.init()
    mem = self.step.memory_analysis()
    self.memory_mb = None if mem is None else (
        mem.argument_size_in_bytes + mem.output_size_in_bytes
        + mem.temp_size_in_bytes - mem.alias_size_in_bytes) / 2**20
    host = synthetic_batches(num_batches, b // jax.process_count(),
                             d.seq_length, d.max_predictions_per_seq,
                             config.model.vocab_size)
    self.batches = [sharding.global_batch(x, p.batch_sharding) for x in host]
    self.i = 0
    if warmup:
      self.run(warmup, record=False)

  def run(self, n: int, record: bool = True):
    for _ in range(n):
      t = time.perf_counter()
      self.state, metrics = self.step(self.state,
                                      self.batches[self.i % len(self.batches)])
      metrics["loss"].block_until_ready()
      if record:
        self.times.append(time.perf_counter() - t)
      self.i += 1


def benchmark(config, steps: int, rounds: int, warmup: int, compare: bool,
              flax_python: str | None = None, peers=("flax", "torch"),
              torch_python: str | None = None,
              peer_venvs: str = DEFAULT_PEER_VENVS) -> dict:
  import jax

  from bert_jax import objectives
  from bert_jax.hf import checkpoint_io
  from bert_jax.hf import mapping
  from bert_jax.training import utilization

  family = mapping.for_objective(config.objective.name).name
  if compare and family != "bert" and "flax" in peers:
    raise ValueError(f"--compare --peers=flax: Hugging Face has no Flax "
                     f"model of the {family!r} family; use --peers=torch.")
  b, t = config.train.batch_size, config.data.seq_length
  dtype = config.model.dtype
  tokens_per_step = b * t
  peak, peak_source = utilization.peak_tflops(dtype,
                                        config.train.peak_tflops)
  ours = Ours(config, warmup)
  runners = [("ours", ours)]
  if compare:
    spec = dict(bert_config=checkpoint_io.hf_config_from_model_config(
        config.model, family=family), family=family, dtype=dtype,
                data=dict(num=4, batch=b, seq=t,
                          preds=config.data.max_predictions_per_seq,
                          vocab=config.model.vocab_size))
    if "flax" in peers:
      runners.append(("hf_flax", Peer(
          "flax", flax_python or peer_python("flax", peer_venvs), spec,
          warmup)))
    if "torch" in peers:
      runners.append(("pytorch", Peer(
          "torch", torch_python or peer_python("torch", peer_venvs), spec,
          warmup)))
  measured_peak = peak_source.startswith("measured")
  for _ in range(rounds):  # Alternate so that noise hits everyone alike.
    for _, r in runners:
      r.run(steps)
    if measured_peak:  # The machine's best: re-measured between rounds.
      peak = max(peak, utilization.measure_matmul_tflops(dtype, cache=False))

  flops_per_step = objectives.train_flops_per_step(config)
  st = _stats(ours.times)
  tflops, mfu = utilization.mfu(flops_per_step, st["p50"], jax.device_count(), peak)
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
      step_time_p50=st["p50"], step_time_p90=st["p90"], timed_steps=st["n"],
      compile_seconds=ours.compile_seconds,
      train_tflops_per_step=flops_per_step / 1e12,
      tflops_per_device=tflops, mfu=mfu, peak_tflops=peak,
      peak_source=peak_source, peak_memory_mb=ours.memory_mb,
      max_rss_mb=_max_rss_mb())
  for name, r in runners[1:]:
    pst = _stats(r.times)
    result[name] = dict(tokens_per_sec=tokens_per_step / pst["p50"],
                        step_time_p50=pst["p50"], step_time_p90=pst["p90"],
                        timed_steps=pst["n"],
                        compile_seconds=r.info["compile_seconds"],
                        max_rss_mb=r.max_rss_mb, framework=r.info["framework"])
    result[f"vs_{name}"] = result["tokens_per_sec"] / result[name][
        "tokens_per_sec"]
    r.close()
  return result


def parse_variant(text: str):
  """"name:model.fused_qkv=True,model.dtype=bfloat16" -> (name, overrides)."""
  import ast
  name, _, rest = text.partition(":")
  overrides = {}
  for item in filter(None, rest.split(",")):
    key, _, value = item.partition("=")
    try:
      overrides[key.strip()] = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
      overrides[key.strip()] = value.strip()
  return name, overrides


def compare_variants(config, variants: list[str], steps: int, rounds: int,
                     warmup: int) -> dict:
  """Ours under several overrides, alternating, each vs the first (base).

  The pseudo-key `gather=False` computes vocabulary logits at every position
  (ablation of the masked-position gather).
  """
  import jax

  from bert_jax import objectives
  from bert_jax.training import utilization
  runners = []
  for text in ["base:"] + list(variants):
    name, overrides = parse_variant(text)
    c = config.copy_and_resolve_references()
    gather = overrides.pop("gather", True)
    for key, value in overrides.items():
      group, field = key.split(".", 1)
      c[group][field] = value
    runners.append((name, c, Ours(c, warmup, gather=gather)))
  for _ in range(rounds):
    for _, _, r in runners:
      r.run(steps)
  tokens = config.train.batch_size * config.data.seq_length
  out = {}
  for name, c, r in runners:
    p50 = _stats(r.times)["p50"]
    peak, _ = utilization.peak_tflops(c.model.dtype, c.train.peak_tflops)
    _, mfu = utilization.mfu(objectives.train_flops_per_step(c), p50, jax.device_count(),
                       peak)
    out[name] = dict(tokens_per_sec=tokens / p50, step_time_p50=p50, mfu=mfu,
                     compile_seconds=r.compile_seconds,
                     peak_memory_mb=r.memory_mb)
  base = out["base"]["tokens_per_sec"]
  for v in out.values():
    v["vs_base"] = v["tokens_per_sec"] / base
  return out


# Fused attention kinds and the backends they run on ("xla" runs anywhere).
ATTENTION_BACKENDS = {"dot_product_attention": ("cpu", "gpu", "tpu"),
                      "cudnn": ("gpu",), "splash": ("tpu",)}


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
  import jax

  from bert_jax import objectives
  from bert_jax.training import utilization
  cells = [("config", *cell) for cell in seq_length_configs(
      config, seq_lengths, tokens, attention, jax.default_backend())]
  if baseline is not None:
    cells += [("baseline", *cell) for cell in seq_length_configs(
        baseline, seq_lengths, tokens, attention, jax.default_backend())]
  runners = [(m, t, kind, c, Ours(c, warmup) if c is not None else None)
             for m, t, kind, c in cells]
  for _ in range(rounds):  # Alternate so that noise hits every cell alike.
    for *_, r in runners:
      if r is not None:
        r.run(steps)
  rows, firsts = [], {}
  for name, t, kind, c, r in runners:
    if r is None:
      rows.append(dict(model=name, seq_length=t, attention=kind, runs=False))
      continue
    p50 = _stats(r.times)["p50"]
    fpt = objectives.train_flops_per_step(c) / (c.train.batch_size * t)
    peak, _ = utilization.peak_tflops(c.model.dtype, c.train.peak_tflops)
    _, mfu = utilization.mfu(objectives.train_flops_per_step(c), p50,
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
  import jax
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


def print_human(r: dict):
  c = r["config"]
  print(f"bert_jax {c['family']} {c['layers']}x{c['hidden']} vocab "
        f"{c['vocab']}, batch "
        f"{c['batch_size']} x seq {c['seq_length']}, {c['dtype']}, attention "
        f"{c['attention_impl']}, fused_qkv {c['fused_qkv']}, remat "
        f"{c['remat_policy']} on {r['devices']} {r['device_kind']}")
  mem = ("n/a" if r["peak_memory_mb"] is None
         else f"{r['peak_memory_mb']:.0f} MB")
  print(f"  tokens/s {r['tokens_per_sec']:.0f}  sequences/s "
        f"{r['sequences_per_sec']:.1f}  step p50 {r['step_time_p50']*1e3:.0f} "
        f"ms  p90 {r['step_time_p90']*1e3:.0f} ms  compile "
        f"{r['compile_seconds']:.1f} s  ({r['timed_steps']} steps)")
  print(f"  {r['tflops_per_device']:.3f} TFLOP/s per device  MFU "
        f"{100*r['mfu']:.1f}% of {r['peak_tflops']:.2f} TFLOP/s "
        f"({r['peak_source']})  step memory {mem}  max RSS "
        f"{r['max_rss_mb']:.0f} MB")
  for name in ("hf_flax", "pytorch"):
    if name in r:
      p = r[name]
      print(f"  {name:8s} tokens/s {p['tokens_per_sec']:.0f}  step p50 "
            f"{p['step_time_p50']*1e3:.0f} ms  ({p['framework']})  -> ours is "
            f"{r['vs_' + name]:.2f}x")


def main(argv):
  del argv
  from absl import flags
  F = flags.FLAGS
  config = F.config
  if F.seq_lengths:
    tokens = F.tokens_per_batch or (config.train.batch_size
                                    * config.data.seq_length)
    rows = compare_seq_lengths(config, [int(t) for t in F.seq_lengths],
                               tokens, list(F.attention), F.steps, F.rounds,
                               F.warmup, F.baseline_config)
    if F.json:
      print(json.dumps(rows))
    else:
      print_seq_lengths(rows, tokens, config)
    return
  if F.variant:
    r = compare_variants(config, F.variant, F.steps, F.rounds, F.warmup)
    if F.json:
      print(json.dumps(r))
    else:
      for name, v in r.items():
        mem = v["peak_memory_mb"]
        print(f"{name:24s} tokens/s {v['tokens_per_sec']:7.0f}  "
              f"x{v['vs_base']:.2f} vs base  MFU {100*v['mfu']:.1f}%  "
              f"compile {v['compile_seconds']:.0f} s  step memory "
              f"{mem if mem is None else round(mem)} MB")
    return
  r = benchmark(config, F.steps, F.rounds, F.warmup, F.compare,
                F.hf_flax_python or None, tuple(F.peers),
                F.torch_python or None, F.peer_venvs)
  if F.json:
    print(json.dumps(r))
  else:
    print_human(r)


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "--_peer":
    peer_worker(sys.argv[2], sys.argv[3])
    sys.exit(0)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from absl import app
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).",
                                  lock_config=False)
  flags.mark_flags_as_required(["config"])
  flags.DEFINE_integer("steps", 3, "Timed steps per run (per round).")
  flags.DEFINE_integer("rounds", 3, "Alternating rounds (ours, flax, torch).")
  flags.DEFINE_integer("warmup", 1, "Untimed steps after compile, each impl.")
  flags.DEFINE_bool("compare", False, "Also run HF Flax and PyTorch BERT "
                    "(PyTorch ModernBERT for a ModernBERT config).")
  config_flags.DEFINE_config_file(
      "baseline_config", None, "With --seq_lengths: a second model whose "
      "cells alternate with the config's (e.g. configs/base.py).",
      lock_config=False)
  flags.DEFINE_list("peers", ["flax", "torch"], "Peers for --compare.")
  flags.DEFINE_string("hf_flax_python", "", "Python for the HF Flax peer "
                      "(default: this one if it has the pins, else "
                      "<peer_venvs>/flax, created on demand).")
  flags.DEFINE_string("torch_python", "", "Python for the PyTorch peer "
                      "(default: this one if it has requirements-export.txt, "
                      "else <peer_venvs>/torch, created on demand).")
  flags.DEFINE_string("peer_venvs", DEFAULT_PEER_VENVS, "Where the peers' "
                      "venvs are built (plain venvs pinned from the "
                      "requirements files).")
  flags.DEFINE_bool("json", False, "Print one JSON object.")
  flags.DEFINE_list("seq_lengths", [], "Instead of peers: these sequence "
                    "lengths at equal tokens per batch, e.g. 64,128,256,512.")
  flags.DEFINE_integer("tokens_per_batch", 0, "With --seq_lengths: tokens "
                       "per batch (default: the config's batch x seq).")
  flags.DEFINE_list("attention", ["xla", "dot_product_attention", "cudnn",
                                  "splash"],
                    "With --seq_lengths: attention kinds (those that cannot "
                    "run on this backend are listed as such).")
  flags.DEFINE_multi_string(
      "variant", [], "Instead of peers: ours with overrides, alternating with "
      "the base config, e.g. --variant=fused:model.fused_qkv=True "
      "(gather=False: logits at every position).")
  app.run(main)
