"""What the speed tools share: one timing harness, synthetic batches, and
our compiled train step on them.

The harness times several sides of a comparison (ours under two configs,
ours against Hugging Face) on one machine whose speed drifts: every side
first runs `warmup` untimed steps after compiling, then the sides take
turns, `steps` timed steps each, for `rounds` rounds, so that noise hits
all alike; each side's step times give min / median / p90 / max. A side is
anything with ``run(n, record)`` and ``times``: `Side` for steps run in this
process, or a peer driven in another process (tools/benchmark.py).

Used by tools/benchmark.py, bench_seq_lengths.py, bench_variants.py,
bench_packing.py, bench_finetune.py, bench_embeddings.py and
profile_step.py; nothing in the package imports it.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import jax
import numpy as np

from bert_jax import compose
from bert_jax import pretrained
from bert_jax.data import tokenizers
from bert_jax.downstream import finetuning
from bert_jax.training import compiled
from bert_jax.training import config_checks
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib


# ==============================================================================
# The timing harness.
# ==============================================================================
class Timed(Protocol):
  times: list[float]

  def run(self, n: int, record: bool = True) -> None:
    ...


class Side:
  """A side whose steps run in this process: `step(k)` runs one step on its
  k-th batch and blocks until it is done (what it returns is kept in
  `outputs`, e.g. device metrics read back)."""

  name = ""

  def __init__(self, num_batches: int):
    self.num_batches = num_batches
    self.i = 0
    self.times: list[float] = []  # Seconds per timed step.
    self.batches: list[int] = []  # The batch index of each timed step.
    self.outputs: list[Any] = []  # What each timed step returned.

  def step(self, k: int):
    raise NotImplementedError

  def run(self, n: int, record: bool = True) -> None:
    for _ in range(n):
      k = self.i % self.num_batches
      start = time.perf_counter()
      out = self.step(k)
      seconds = time.perf_counter() - start
      if record:
        self.times.append(seconds)
        self.batches.append(k)
        self.outputs.append(out)
      self.i += 1


def alternate(sides: Sequence[Timed], *, warmup: int, rounds: int,
              steps: int, between_rounds=None) -> None:
  """`warmup` untimed steps per side, then `rounds` rounds of `steps` timed
  steps per side in turn; `between_rounds()` after each round (e.g. to
  measure the machine's peak again)."""
  for side in sides:
    if warmup:
      side.run(warmup, record=False)
  for _ in range(rounds):
    for side in sides:
      side.run(steps)
    if between_rounds is not None:
      between_rounds()


def stats(times: Sequence[float]) -> dict:
  """min / p50 (median) / p90 / max / mean seconds of timed steps, and n."""
  a = np.asarray(times, np.float64)
  return dict(min=float(a.min()), p50=float(np.median(a)),
              p90=float(np.percentile(a, 90)), max=float(a.max()),
              mean=float(a.mean()), n=len(a))


def report(benchmark: Callable[[], dict], format_report: Callable[[dict], str],
           json_path: str = "") -> None:
  """A benchmark tool's ending: run `benchmark()`, print its report and,
  given `json_path`, write the result there as JSON for a later
  comparison. A config or file the benchmark refuses (ValueError,
  FileNotFoundError) is one `error: ...` line and exit 1: the user's to
  fix, so no traceback."""
  try:
    result = benchmark()
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(format_report(result))
  if json_path:
    with open(json_path, "w") as f:
      json.dump(result, f, indent=1)


# ==============================================================================
# Synthetic batches (numpy; the same arrays for ours and the peers).
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


def max_rss_mb() -> float:
  """This process's peak resident memory."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ==============================================================================
# Ours: the compiled train step on synthetic device-resident batches.
# ==============================================================================
class Ours(Side):
  """bert_jax's train step (`steps.Programs`, the trainer's), compiled ahead
  of time for the config's shapes, on `num_batches` synthetic batches, or
  on `host_batches` (this host's share of the objective's features, one
  shape: e.g. a fine-tuning task's own, :func:`task_batches`).
  `objective`: another objective than the config's (an ablation)."""

  def __init__(self, config, num_batches: int = 4, objective=None,
               name: str = "ours", host_batches=None):
    super().__init__(num_batches if host_batches is None else
                     len(host_batches))
    self.name, self.config = name, config
    # The trainer's startup checks: one sentence, not a broadcasting error.
    config_checks.validate(config, jax.device_count(), jax.process_count(),
                           check_sources=False)
    self.mesh = sharding.make_mesh(config.mesh)
    self.programs = p = steps_lib.Programs(config, self.mesh, objective)
    b, d = config.train.batch_size, config.data
    if host_batches is None:
      host_batches = synthetic_batches(
          num_batches, b // jax.process_count(), d.seq_length,
          d.max_predictions_per_seq, config.model.vocab_size)
    names = p.objective.feature_spec(config)
    self.host_batches = [{k: x[k] for k in names} for x in host_batches]
    self.device_batches = [sharding.global_batch(x, p.batch_sharding)
                           for x in self.host_batches]
    spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                    sharding=p.batch_sharding)
            for k, v in self.device_batches[0].items()}
    with p.context():
      self.compiled = compiled.compile_ahead(p.train_step, p.abstract_state,
                                             spec)
      self.state = p.init()
    self.compile_seconds = self.compiled.seconds
    memory = self.compiled.memory
    self.memory_mb = None if memory is None else memory.peak / 2**20

  def step(self, k: int):
    self.state, metrics = self.compiled(self.state, self.device_batches[k])
    metrics["loss"].block_until_ready()


# ==============================================================================
# A fine-tuning task's own batches.
# ==============================================================================
class FinetuningTask(NamedTuple):
  """What a fine-tuning run reads before it builds its batches."""
  source: pretrained.Source  # train.init_from, resolved.
  kind: Any  # tasks.Kind
  task: Any  # The kind's task spec.
  train_rows: Any
  eval_rows: dict  # {eval split: rows}
  tokenizer: Any  # The source's.


def read_finetuning_task(config) -> FinetuningTask:
  """The task `config` names (task.*) and train.init_from's tokenizer, read
  as the fine-tuning run reads them, writing nothing (no label map)."""
  source = pretrained.resolve(config.train.init_from,
                              config.train.init_from_step or None)
  spec = pretrained.tokenizer_spec(source)
  kind = finetuning.task_kind(config)
  task, train_rows, eval_rows = finetuning.read_task(config, "")
  tok = tokenizers.load(spec.path, spec.kind, spec.lower_case)
  return FinetuningTask(source, kind, task, train_rows, eval_rows, tok)


def task_batches(config, num: int):
  """(the run's config, `num` training batches of one shape) of the
  fine-tuning task `config` names (task.*, train.init_from: its
  tokenizer and architecture; data.packing: packed rows), as the
  fine-tuning run builds them (the task kind's input). Bucketed batches
  keep the most common bucket's."""
  t = read_finetuning_task(config)
  inputs = t.kind.make_input(config, t.tokenizer, t.task, t.train_rows, {})
  config = finetuning.resolve_config(config, t.source, t.task,
                                     inputs.num_train)
  batches = [next(inputs.train_iter) for _ in range(4 * num)]
  shapes = [b["input_ids"].shape for b in batches]
  common = max(set(shapes), key=shapes.count)
  return config, [b for b in batches if b["input_ids"].shape == common][:num]


def train_step_memory(config, chunk: int = 0) -> dict:
  """XLA's per-device memory of the config's compiled train step at its
  batch and longest bucket, with train.cache_chunk_size=`chunk` (0: the
  plain step): {peak_mb, temporaries_mb}, {} where XLA reports none.
  Compiled ahead of time: nothing runs, no weights are read."""
  c = config.copy_and_resolve_references()
  c.train.cache_chunk_size = chunk
  p = steps_lib.Programs(c, sharding.make_mesh(c.mesh), compose.objective(c))
  with p.context():
    step = compiled.compile_ahead(p.train_step, p.abstract_state,
                                  p.batch_spec(int(c.train.batch_size)))
  m = step.memory
  return {} if m is None else dict(peak_mb=m.peak / compiled.MB,
                                   temporaries_mb=m.temporaries / compiled.MB)
