"""BERT pretraining: sharded state, jitted train/eval steps and the loop.

Read top to bottom: Config checks, Mesh, State, Loss, Update step, Eval step,
Logging, Loop. The steps are pure functions of (state, batch) jitted with
explicit in/out shardings and donated state; the model is rebuilt inside the
trace from its static graphdef and the params pytree.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from bert_jax import checkpointing
from bert_jax import config_checks
from bert_jax import features
from bert_jax import flops as flops_lib
from bert_jax import metrics_writer
from bert_jax import objectives
from bert_jax import optim
from bert_jax import phases as phases_lib
from bert_jax import preemption
from bert_jax import pretraining_data
from bert_jax import pretrained
from bert_jax import sharding



# ==============================================================================
# State: created directly sharded (eval_shape -> shardings -> jitted init).
# ==============================================================================
def abstract_model(config: ml_collections.ConfigDict, objective=None):
  objective = objective or objectives.for_config(config)
  return nnx.eval_shape(lambda: objective.make_model(config, nnx.Rngs(0)))


def abstract_frozen(config, objective):
  """The objective's fixed module (a teacher) as shapes, or None."""
  if objective.make_frozen is None:
    return None
  return nnx.eval_shape(lambda: objective.make_frozen(config, nnx.Rngs(0)))


def init_state_fn(config, objective, tx):
  """A function () -> train state; jitted with out_shardings, never run eagerly.

  Objectives with fixed params (`make_frozen`) get them as state["frozen"]:
  carried through every step unchanged, checkpointed with the rest.
  """

  def init():
    root = jax.random.key(config.train.seed)
    model = objective.make_model(
        config, nnx.Rngs(params=jax.random.fold_in(root, 0)))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    state = dict(
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.key_data(jax.random.fold_in(root, 1)),
        params=params,
        opt_state=tx.init(params),
        nonfinite_steps=jnp.zeros((), jnp.int32),
        nonfinite_in_a_row=jnp.zeros((), jnp.int32),
    )
    if objective.make_frozen is not None:  # Salt 2 is the eval rng's.
      frozen = objective.make_frozen(
          config, nnx.Rngs(params=jax.random.fold_in(root, 3)))
      state["frozen"] = nnx.state(frozen, nnx.Param).to_pure_dict()
    return state

  return init


def state_shardings(config, mesh, tx, abstract_state, objective):
  rules = sharding.rules(config.mesh)
  _, abs_params = nnx.split(abstract_model(config, objective), nnx.Param)
  params = sharding.param_shardings(abs_params, mesh, rules)
  rep = sharding.replicated(mesh)
  out = dict(
      step=rep, rng=rep, params=params,
      opt_state=sharding.opt_state_shardings(tx, abstract_state["opt_state"],
                                             params, mesh),
      nonfinite_steps=rep, nonfinite_in_a_row=rep)
  frozen = abstract_frozen(config, objective)
  if frozen is not None:
    out["frozen"] = sharding.param_shardings(
        nnx.split(frozen, nnx.Param)[1], mesh, rules)
  return out


def _frozen_kwargs(frozen, frozen_graphdef) -> dict:
  """{"frozen": module} for loss_sums when the objective has fixed params."""
  if frozen is None:
    return {}
  return {"frozen": nnx.merge(frozen_graphdef,
                              jax.lax.stop_gradient(frozen))}


# ==============================================================================
# Update step.
# ==============================================================================
def _microbatches(batch, k: int):
  """[B, ...] -> [k, B/k, ...] taking every k-th row, so that each microbatch
  is spread over all data-parallel devices rather than living on a few."""
  def split(x):
    x = x.reshape((x.shape[0] // k, k) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def train_step(state, batch, *, graphdef, tx, config, objective,
               frozen_graphdef=None):
  """One optimizer update on a global batch; returns (state, metrics).

  The objective's loss is normalised by counts of the whole global batch,
  so gradient accumulation and any mesh give the same update.
  """
  accum = int(config.train.grad_accum_steps)
  step = state["step"]
  key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), step)
  counts = objective.counts(batch, config)

  def loss_fn(params, micro, micro_key):
    model = nnx.merge(graphdef, params)
    sums = objective.loss_sums(
        model, micro, micro_key, False, config,
        **_frozen_kwargs(state.get("frozen"), frozen_graphdef))
    return objective.loss(sums, counts, config), sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  params = state["params"]
  if accum == 1:
    grads, sums = grad_fn(params, batch, key)
  else:
    def body(carry, xs):
      g_acc, s_acc = carry
      micro, i = xs
      g, s = grad_fn(params, micro, jax.random.fold_in(key, i))
      return (jax.tree.map(jnp.add, g_acc, g),
              jax.tree.map(jnp.add, s_acc, s)), None
    zeros_g = jax.tree.map(jnp.zeros_like, params)
    first = jax.tree.map(lambda x: x[0], _microbatches(batch, accum))
    sums_shape = jax.eval_shape(lambda: loss_fn(params, first, key)[1])
    zeros_s = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), sums_shape)
    (grads, sums), _ = jax.lax.scan(
        body, (zeros_g, zeros_s), (_microbatches(batch, accum),
                                   jnp.arange(accum)))

  loss = objective.loss(sums, counts, config)
  grad_norm = optax.tree.norm(grads)
  updates, new_opt_state = tx.update(grads, state["opt_state"], params)
  new_params = optax.apply_updates(params, updates)

  # A non-finite loss or gradient never reaches the weights: the update is
  # dropped and counted; the loop applies the configured policy.
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  keep = lambda new, old: jax.tree.map(
      lambda a, b: jnp.where(finite, a, b), new, old)
  new_state = dict(
      step=step + 1,
      rng=state["rng"],
      params=keep(new_params, params),
      opt_state=keep(new_opt_state, state["opt_state"]),
      nonfinite_steps=state["nonfinite_steps"] + (~finite).astype(jnp.int32),
      nonfinite_in_a_row=jnp.where(finite, 0, state["nonfinite_in_a_row"] + 1),
  )
  if "frozen" in state:
    new_state["frozen"] = state["frozen"]
  schedule = optim.learning_rate_schedule(config.train,
                                         phases_lib.resolve(config))
  metrics = dict(objective.metrics(sums, counts, config),
                 learning_rate=schedule(step), grad_norm=grad_norm,
                 finite=finite)
  metrics["loss"] = loss
  return new_state, metrics


def batch_loss(params, batch, *, graphdef, config, objective, rng=None,
               frozen=None, frozen_graphdef=None):
  """The train step's loss on one whole batch, without dropout when `rng`
  is None: what tests and tools differentiate to compare with a step."""
  model = nnx.merge(graphdef, params)
  key = jax.random.key(0) if rng is None else rng
  sums = objective.loss_sums(model, batch, key, rng is None, config,
                             **_frozen_kwargs(frozen, frozen_graphdef))
  return objective.loss(sums, objective.counts(batch, config), config)


# ==============================================================================
# Eval step: per-batch sums, added up on the host.
# ==============================================================================
def eval_step(params, batch, rng, frozen=None, *, graphdef, config, objective,
              frozen_graphdef=None):
  """Sums of one eval batch; `rng` only feeds objectives that sample;
  `frozen` is state["frozen"] for objectives that hold fixed params."""
  model = nnx.merge(graphdef, params)
  return objective.loss_sums(model, batch, jax.random.wrap_key_data(rng),
                             True, config,
                             **_frozen_kwargs(frozen, frozen_graphdef))


# ==============================================================================
# Jitted programs for a config on a mesh (used by the Trainer, tests, tools).
# ==============================================================================
class Programs:
  """State shardings plus jitted init / train_step / eval_step on a mesh.

  `train_step` and `eval_step` are `jax.jit` objects (call them, or
  `.lower(...).compile()` them); run them inside `self.context()` so that
  activation constraints see the mesh and rules.
  """

  def __init__(self, config: ml_collections.ConfigDict, mesh, objective=None):
    """`objective` defaults to the one `config.objective.name` names."""
    self.config, self.mesh = config, mesh
    self.objective = objective = objective or objectives.for_config(config)
    self.rules = sharding.rules(config.mesh)
    self.tx = optim.make_optimizer(config.train, phases_lib.resolve(config))
    self.graphdef = nnx.split(abstract_model(config, objective), nnx.Param)[0]
    frozen = abstract_frozen(config, objective)
    self.frozen_graphdef = (None if frozen is None else
                            nnx.split(frozen, nnx.Param)[0])
    init = init_state_fn(config, objective, self.tx)
    abstract_state = jax.eval_shape(init)
    self.state_sharding = state_shardings(config, mesh, self.tx,
                                          abstract_state, objective)
    self.abstract_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract_state, self.state_sharding)
    self.batch_sharding = sharding.batch_sharding(mesh)
    replicated = sharding.replicated(mesh)
    self.init = jax.jit(init, out_shardings=self.state_sharding)
    self.train_step = jax.jit(
        functools.partial(train_step, graphdef=self.graphdef, tx=self.tx,
                          config=config, objective=objective,
                          frozen_graphdef=self.frozen_graphdef),
        in_shardings=(self.state_sharding, self.batch_sharding),
        out_shardings=(self.state_sharding, replicated),
        donate_argnums=(0,))
    self.eval_step = jax.jit(
        functools.partial(eval_step, graphdef=self.graphdef, config=config,
                          objective=objective,
                          frozen_graphdef=self.frozen_graphdef),
        in_shardings=(self.state_sharding["params"], self.batch_sharding,
                      replicated, self.state_sharding.get("frozen")),
        out_shardings=replicated)

  def warm_start(self, state):
    """A fresh state through the objective's `warm_start` (e.g. the teacher
    loaded and the student initialized from it); unchanged without one."""
    if self.objective.warm_start is None:
      return state
    host = jax.device_get({k: state[k] for k in ("params", "frozen")
                           if k in state})
    params, frozen = self.objective.warm_start(
        self.config, host["params"], host.get("frozen"))
    out = dict(state, params=checkpointing.place_params(
        params, self.abstract_state["params"], source="warm_start"))
    if frozen is not None:
      out["frozen"] = checkpointing.place_params(
          frozen, self.abstract_state["frozen"], source="warm_start")
    return out

  def eval_rng(self, index: int) -> jax.Array:
    """Key data for eval batch `index`: the same every evaluation."""
    # Salt 2: the init key uses 0 (params) and 1 (train state rng).
    key = jax.random.fold_in(jax.random.key(self.config.train.seed), 2)
    return jax.random.key_data(jax.random.fold_in(key, index))

  def context(self):
    return sharding.logical_context(self.mesh, self.rules)

  def batch_spec(self, global_batch_size: int, seq_length: int | None = None,
                 max_predictions: int | None = None) -> dict:
    """ShapeDtypeStructs of a global batch, for ahead-of-time lowering
    (the config's sequence shape unless a phase gives its own)."""
    shapes = features.batch_shapes(
        self.objective.feature_spec(self.config), global_batch_size,
        seq_length or self.config.data.seq_length,
        max_predictions or self.config.data.max_predictions_per_seq)
    return {k: jax.ShapeDtypeStruct(s, d, sharding=self.batch_sharding)
            for k, (s, d) in shapes.items()}


# ==============================================================================
# Logging: absl lines, metrics.jsonl and TensorBoard.
# ==============================================================================
def _bytes_per_device(abstract_tree) -> int:
  """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs."""
  total = 0
  for a in jax.tree.leaves(abstract_tree):
    shard = a.sharding.shard_shape(a.shape)
    total += int(np.prod(shard)) * jnp.dtype(a.dtype).itemsize
  return total


def _latest_step(workdir: str) -> int | None:
  """The newest committed step, read before the Checkpointer (and its
  threads) exists, so that a data error stops the run without one."""
  try:
    steps = checkpointing.committed_steps(workdir)
  except FileNotFoundError:
    return None
  return steps[-1] if steps else None


def _log_memory(what: str, compiled) -> None:
  mem = compiled.memory_analysis()
  if mem is not None:
    logging.info(
        "Compiled %s; per-device memory: arguments %.1f MB, temporaries %.1f "
        "MB, outputs %.1f MB.", what, mem.argument_size_in_bytes / 2**20,
        mem.temp_size_in_bytes / 2**20, mem.output_size_in_bytes / 2**20)


# ==============================================================================
# Loop.
# ==============================================================================
class Trainer:
  """Holds the mesh, compiled steps, state and data for one run.

  Pretraining by default; fine-tuning passes its own `data` (train_iter,
  eval_batches, eval_extras()), `objective`, `evaluate` ((trainer, params)
  -> metrics, for metrics that need every prediction rather than sums) and
  `init_params` ((trainer, fresh params) -> params for a new run).
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *,
               data=None, objective=None, evaluate=None, init_params=None):
    self.config, self.workdir = config, workdir  # Validated by the caller.
    # ---- Phases: the one a resumed run is in decides the first pipeline.
    self.phases = phases_lib.resolve(config)
    latest = _latest_step(workdir)
    self._phase = phases_lib.at_step(self.phases, max((latest or 0) - 1, 0))
    if data is None:
      data = pretraining_data.PretrainingInput(config, workdir,
                              self._phase_config(self._phase))
    elif len(self.phases) > 1:
      raise ValueError("train.phases / train.recipe apply to pretraining "
                       "runs only; leave them empty here.")
    self.data = data
    self.train_iter = self.data.train_iter
    self.eval_batches = self.data.eval_batches
    self._evaluate_fn = evaluate
    self._init_params_fn = init_params

    # ---- Mesh.
    self.mesh = sharding.make_mesh(config.mesh)
    logging.info("Mesh %s over %d devices (%d processes).",
                 sharding.describe(self.mesh), jax.device_count(),
                 jax.process_count())
    self.batch_sharding = sharding.batch_sharding(self.mesh)

    # ---- Model, state shardings and compiled steps (ahead of time).
    self.programs = Programs(config, self.mesh, objective)
    self.abstract_state = self.programs.abstract_state
    self.checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint)
    self._train_steps = {}  # Global batch shape -> compiled step.
    self._compile()

  def _context(self):
    return self.programs.context()

  def _phase_config(self, phase) -> ml_collections.ConfigDict:
    """The config a phase's pipeline and step are built from."""
    if len(self.phases) == 1 and not phases_lib.is_phased(self.config):
      return self.config
    return phases_lib.phase_config(self.config, phase)

  def _compile(self):
    """The train step of the current phase (and of the phases after it, so
    that a later shape that does not fit fails now, not hours in) and the
    eval step, ahead of time."""
    p = self.programs
    start = time.time()
    with self._context():
      later = self.phases[self._phase.index + 1:]
      for phase in [self._phase] + later:
        spec = p.batch_spec(phase.batch_size, phase.seq_length,
                            phase.max_predictions_per_seq)
        step = p.train_step.lower(p.abstract_state, spec).compile()
        if phase is self._phase:
          self.train_step, self._config_shape = step, spec["input_ids"].shape
        else:
          self._train_steps[spec["input_ids"].shape] = step
          _log_memory(f"the train step of phase {phase.index + 1}/"
                      f"{len(self.phases)} ({phase.describe()})", step)
      if self._evaluate_fn is None:  # Else the caller's evaluate compiles.
        self.eval_step = p.eval_step.lower(
            p.abstract_state["params"],
            p.batch_spec(self._eval_local_batch_size() * jax.process_count()),
            p.eval_rng(0), p.abstract_state.get("frozen")).compile()
    self.compile_seconds = time.time() - start
    if "frozen" in p.abstract_state:
      logging.info("Frozen params (no gradient, no optimizer state): %.1f MB "
                   "per device.", _bytes_per_device(p.abstract_state["frozen"])
                   / 2**20)
    _log_memory(f"train step in {self.compile_seconds:.1f}s", self.train_step)

  def _train_step_for(self, batch):
    """The compiled step for this batch's shape: the config's shape is
    compiled at start-up; bucketed fine-tuning compiles each bucket once."""
    shape = batch["input_ids"].shape
    if shape == self._config_shape:
      return self.train_step  # Looked up here so that it can be wrapped.
    step = self._train_steps.get(shape)
    if step is None:
      start = time.time()
      spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                      sharding=self.batch_sharding)
              for k, v in batch.items()}
      with self._context():
        step = self.programs.train_step.lower(self.abstract_state,
                                              spec).compile()
      self._train_steps[shape] = step
      logging.info("Compiled the train step for batch shape %s in %.1fs.",
                   shape, time.time() - start)
    return step

  def _enter_phase(self, phase, step: int) -> None:
    """At a phase boundary: the next phase's pipeline (where it starts:
    train.phase_data), and its step, compiled at start-up."""
    consumed = self.train_iter.examples_consumed
    stats = dict(self.train_iter.stats)
    self.train_iter = self.data.train_iterator(self._phase_config(phase))
    self.train_iter.stats.update(stats)
    where = "the pipeline again with its own seed"
    if self.config.train.phase_data == "continue":
      skipped = self.train_iter.continue_after(consumed)
      where = (f"after the {consumed} examples consumed ({skipped} batches "
               "skipped)")
    logging.info("Phase %d/%d from step %d: %s; data: %s.", phase.index + 1,
                 len(self.phases), step, phase.describe(), where)
    self._phase = phase

  def _eval_local_batch_size(self) -> int:
    first = self.eval_batches[0] if self.eval_batches else None
    if first is None:
      return self.config.train.batch_size // jax.process_count()
    return int(first["input_ids"].shape[0])

  def initial_state(self):
    """Resume from the newest good checkpoint (state and data position);
    else initialize, taking params from `train.init_from` when set.

    An unreadable newest step is set aside with a warning and the previous
    one used; a checkpoint of another model raises (CheckpointMismatchError).
    """
    state, step = self.checkpointer.restore_latest(
        self.abstract_state, self.train_iter, self.config)
    if state is not None:
      phase = phases_lib.at_step(self.phases, max(step - 1, 0))
      if phase.index != self._phase.index:
        # The newest step was unreadable and the one restored is of another
        # phase: its data position is in that phase's pipeline.
        self._phase = phase
        self.train_iter = self.data.train_iterator(self._phase_config(phase))
        state = self.checkpointer.restore(step, self.abstract_state,
                                          self.train_iter, self.config)
      logging.info("Resumed from checkpoint step %d in %s.", step,
                   self.checkpointer.directory)
      return state
    with self._context():
      state = self.programs.warm_start(self.programs.init())
    if self._init_params_fn is not None:
      state = dict(state, params=self._init_params_fn(self, state["params"]))
    elif self.config.train.init_from:
      state = dict(state, params=self._init_params(self.config.train.init_from))
    return state

  def _init_params(self, path: str):
    """Params only (new run from pretrained weights), onto the state's mesh."""
    source = pretrained.resolve(path)
    params, report = pretrained.load_params(
        source, self.config.model,
        abstract_params=self.abstract_state["params"],
        seed=self.config.train.seed, config=self.config)
    logging.info("train.init_from: params of %s (%s, step %s).\n%s", path,
                 source.kind, source.step, report)
    return params

  def evaluate(self, params, frozen=None) -> dict:
    """The objective's metrics over all eval batches (sums added in float64),
    or the caller's `evaluate` when it needs every prediction. `frozen` is
    state["frozen"] for objectives that hold fixed params."""
    if self._evaluate_fn is not None:
      return self._evaluate_fn(self, params)
    totals = {}
    for i, local in enumerate(self.eval_batches):
      batch = sharding.global_batch(local, self.batch_sharding)
      sums = jax.device_get(self.eval_step(params, batch,
                                           self.programs.eval_rng(i), frozen))
      totals = {k: totals.get(k, 0.0) + float(v) for k, v in sums.items()}
    return {k: float(v) for k, v in
            self.programs.objective.metrics(totals, totals, self.config).items()}

  def _format(self, metrics: dict, everything: bool = False) -> str:
    """The objective's log keys (or every metric, for a custom evaluate)."""
    keys = ([(k, k) for k in metrics] if everything else
            self.programs.objective.log_keys)
    return "  ".join(f"{label} {metrics[key]:.4f}" for label, key in keys
                     if key in metrics)

  def run(self) -> dict:
    config, train = self.config, self.config.train
    state = self.initial_state()
    start_step = int(jax.device_get(state["step"]))
    # ---- Stop safely: non-finite policy and preemption (SIGTERM).
    self._nonfinite = preemption.NonFiniteMonitor(
        train.nonfinite_policy, train.max_nonfinite_in_a_row,
        in_a_row=int(jax.device_get(state["nonfinite_in_a_row"])),
        total=int(jax.device_get(state["nonfinite_steps"])))
    self._nonfinite.last_checkpoint = self.checkpointer.latest_step()
    self._preemption = preemption.PreemptionWatcher()
    writer = metrics_writer.MetricsWriter(
        self.workdir, enabled=jax.process_index() == 0)
    phase_config = self._phase_config(self._phase)
    tokens_per_step = self._phase.batch_size * self._phase.seq_length
    flops_per_step = flops_lib.train_flops_per_step(phase_config)
    peak, peak_source = flops_lib.peak_tflops(
        config.model.dtype, train.peak_tflops)
    logging.info("%.3g training TFLOPs per step; peak %.1f TFLOP/s per device "
                 "(%s, %s).", flops_per_step / 1e12, peak, peak_source,
                 config.model.dtype)
    if len(self.phases) > 1:
      logging.info("Phases: %s (learning-rate schedule %s).", "; ".join(
          f"{p.index + 1}: steps {p.start}-{p.end} at {p.describe()}"
          for p in self.phases), train.phase_schedule)
    last_metrics: dict[str, Any] = {}
    if start_step >= train.num_steps:
      logging.info("Checkpoint is at step %d >= train.num_steps=%d: nothing "
                   "to do.", start_step, train.num_steps)
    t_last, step_last = time.time(), start_step
    for step in range(start_step, train.num_steps):
      if step >= self._phase.end:
        self._enter_phase(phases_lib.at_step(self.phases, step), step)
        tokens_per_step = self._phase.batch_size * self._phase.seq_length
        flops_per_step = flops_lib.train_flops_per_step(
            self._phase_config(self._phase))
        t_last, step_last = time.time(), step
      batch = sharding.global_batch(next(self.train_iter), self.batch_sharding)
      state, metrics = self._train_step_for(batch)(state, batch)
      done = step + 1
      self.checkpointer.check_for_errors()  # A failed async save stops here.
      self._nonfinite.observe(done, metrics["finite"])
      is_last = done == train.num_steps
      if done % train.log_every == 0 or is_last:
        metrics = jax.device_get(metrics)
        now = time.time()
        tps = tokens_per_step * (done - step_last) / max(now - t_last, 1e-9)
        t_last, step_last = now, done
        self._nonfinite.flush()  # Apply train.nonfinite_policy so far.
        metrics = {k: float(v) for k, v in metrics.items() if k != "finite"}
        metrics["tokens_per_sec"] = tps
        metrics["tflops_per_device"], metrics["mfu"] = flops_lib.mfu(
            flops_per_step, tokens_per_step / max(tps, 1e-9),
            jax.device_count(), peak)
        eta = (train.num_steps - done) * tokens_per_step / max(tps, 1e-9)
        logging.info(
            "step %d/%d  %s  lr %.2e  grad_norm %.3f  tokens/s %.0f  "
            "MFU %.1f%%  ETA %s", done, train.num_steps,
            self._format(metrics), metrics["learning_rate"],
            metrics["grad_norm"], tps, 100 * metrics["mfu"],
            metrics_writer.format_duration(eta))
        writer.write(done, "train", metrics)
        last_metrics = metrics
      if done % train.eval_every == 0 or is_last:
        eval_metrics = self.evaluate(state["params"], state.get("frozen"))
        extras = self.data.eval_extras()
        eval_metrics.update(extras)
        logging.info("eval step %d  %s%s", done, self._format(
            eval_metrics, everything=self._evaluate_fn is not None),
                     "".join(f"  ({k} {v:.4f})" for k, v in extras.items()))
        writer.write(done, "eval", eval_metrics)
        last_metrics = {**last_metrics,
                        **{f"eval_{k}": v for k, v in eval_metrics.items()}}
      preempted = self._preemption.reached(done)
      if (done % config.checkpoint.save_every_steps == 0 or is_last or
          preempted):
        self._nonfinite.flush()  # Apply the policy before anything is saved.
        self.checkpointer.save(done, state, self.train_iter,
                               meta=dict(config=config.to_dict(),
                                         metrics=last_metrics),
                               force=is_last or preempted)
        self._nonfinite.last_checkpoint = done
      if preempted:
        logging.warning("Preempted: checkpoint of step %d committed; run the "
                        "same command to resume.", done)
        last_metrics = {**last_metrics, "preempted_at_step": done}
        break
    self._nonfinite.flush()
    self.shutdown()
    writer.close()
    self.final_state = state
    return last_metrics

  def shutdown(self):
    """Commit in-flight async saves and restore signal handlers. Runs at the
    end of `run` and, via train_and_evaluate, when the run stops on an
    error, so that the last good checkpoint is always complete."""
    self.checkpointer.wait()
    self.checkpointer.close()
    if getattr(self, "_preemption", None) is not None:
      self._preemption.close()


def run_trainer(trainer: Trainer, lock) -> dict:
  """Run `trainer` under the workdir `lock` (checked before every save)."""
  trainer.checkpointer.guard = lock.verify
  try:
    return trainer.run()
  finally:
    trainer.shutdown()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       take_over_workdir: bool = False) -> dict:
  """Train per `config` in `workdir`, resuming from its latest checkpoint.

  Every check runs before anything is written; then the run takes the
  workdir (`workdir_lock`: a second run on it is refused before it writes).
  """
  from bert_jax import workdir_lock  # pylint: disable=g-import-not-at-top
  config_checks.validate(config, jax.device_count(), jax.process_count())
  with workdir_lock.hold(workdir, take_over=take_over_workdir) as lock:
    return run_trainer(Trainer(config, workdir), lock)
