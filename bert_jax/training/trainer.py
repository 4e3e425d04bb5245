"""The training loop: `Trainer` (mesh, compiled steps, state, data, logging,
checkpoints, preemption) and `train_and_evaluate`, the pretraining job."""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
import numpy as np
from absl import logging

from bert_jax import compose
from bert_jax import pretrained
from bert_jax.checkpoints import manager
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.checkpoints import workdir_lock
from bert_jax.training import compiled as compiled_lib
from bert_jax.training import config_checks
from bert_jax.training import metrics_writer
from bert_jax.training import phases as phases_lib
from bert_jax.training import preemption
from bert_jax.training import pretraining_input
from bert_jax.training import sharding
from bert_jax.training import start_from
from bert_jax.training import steps as steps_lib
from bert_jax.training import utilization


# ==============================================================================
# Logging: absl lines, metrics.jsonl and TensorBoard.
# ==============================================================================
def _latest_step(workdir: str) -> int | None:
  """The newest committed step, read before the Checkpointer (and its
  threads) exists, so that a data error stops the run without one."""
  try:
    steps = checkpoint_reading.committed_steps(workdir)
  except FileNotFoundError:
    return None
  return steps[-1] if steps else None


def _log_memory(what: str, executable) -> None:
  mem = compiled_lib.memory(executable)
  if mem is not None:
    logging.info("Compiled %s; %s.", what, mem)


# ==============================================================================
# Loop.
# ==============================================================================
class Trainer:
  """Holds the mesh, compiled steps, state and data for one run.

  Pretraining by default; fine-tuning passes its own `data` (train_iter,
  eval_batches, eval_extras()), `objective`, `evaluate` ((trainer, params)
  -> metrics, for metrics that need every prediction rather than sums: it
  gets them from `predict`) and `init_params` ((fresh params, abstract
  params) -> params for a new run, placed like the abstract ones). `phases`
  are the ones `config_checks.validate` returned (None: resolved here).
  """

  def __init__(self, config: ml_collections.ConfigDict, workdir: str, *,
               data=None, objective=None, evaluate=None, init_params=None,
               phases=None):
    self.config, self.workdir = config, workdir  # Validated by the caller.
    # ---- Phases: the one a resumed run is in decides the first pipeline.
    self.phases = phases_lib.resolve(config) if phases is None else phases
    latest = _latest_step(workdir)
    self._phase = phases_lib.at_step(self.phases, max((latest or 0) - 1, 0))
    self._planned = data is None  # Pretraining: batches as the phases say.
    if data is None:
      data = pretraining_input.PretrainingInput(
          config, workdir, self._phase_config(self._phase),
          self._unit_rows(self._phase))
    elif len(self.phases) > 1 or self.phases[0].ramp:
      raise ValueError("train.phases / recipe / batch_warmup apply to "
                       "pretraining runs only; leave them empty here.")
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

    # ---- Model, state shardings and compiled steps (ahead of time).
    self.programs = steps_lib.Programs(config, self.mesh, objective,
                                       phases=self.phases)
    self.abstract_state = self.programs.abstract_state
    self.batch_sharding = self.programs.batch_sharding
    self.checkpointer = manager.Checkpointer(workdir, config.checkpoint)
    self._train_steps = {}  # Global batch shape -> compiled step.
    # (phase index, global batch) -> (compiled step, batch shape).
    self._phase_steps, self._size = {}, None
    self._compile(latest or 0)

  def _context(self):
    return self.programs.context()

  def _phase_config(self, phase) -> ml_collections.ConfigDict:
    """The config a phase's pipeline and step are built from."""
    if len(self.phases) == 1 and not phases_lib.is_phased(self.config):
      return self.config
    return phases_lib.phase_config(self.config, phase)

  def _unit_rows(self, phase) -> int | None:
    """Rows per pipeline batch on this host: the warm-up's common divisor
    (a step takes as many as its size needs); None: the phase's batch."""
    return phase.unit // jax.process_count() if phase.ramp else None

  def _compile(self, first_step: int):
    """The train step of the current phase (every batch size of it, and of
    the phases after it, so that a later shape that does not fit fails now,
    not hours in) and the eval step, ahead of time."""
    p = self.programs
    start = time.time()
    with self._context():
      later = self.phases[self._phase.index + 1:]
      for phase in [self._phase] + later:
        step = self._compile_phase(phase)
        if phase is not self._phase:
          _log_memory(f"the train step of phase {phase.index + 1}/"
                      f"{len(self.phases)} ({phase.describe()})", step)
      self._use_batch(first_step)
      self._compile_eval(self._phase)
    self.compile_seconds = time.time() - start
    if "frozen" in p.abstract_state:
      logging.info("Frozen params (no gradient, no optimizer state): %.1f MB "
                   "per device.", compiled_lib.bytes_per_device(
                       p.abstract_state["frozen"]) / 2**20)
    _log_memory(f"train step in {self.compile_seconds:.1f}s", self.train_step)

  def _compile_phase(self, phase):
    """The train steps of `phase` (its shapes, each batch size of a warm-up,
    its model), compiled once; returns the one of its full batch."""
    p = self.programs
    train_step, _ = p.steps_for(self._phase_config(phase))
    for size in phase.batch_sizes:
      if (phase.index, size) not in self._phase_steps:
        spec = p.batch_spec(size, phase.seq_length,
                            phase.max_predictions_per_seq)
        compiled = compiled_lib.compile_ahead(train_step, p.abstract_state,
                                              spec)
        self._phase_steps[(phase.index, size)] = (
            compiled.executable, spec["input_ids"].shape)
    return self._phase_steps[(phase.index, phase.batch_size)][0]

  def _use_batch(self, step: int) -> None:
    """The current phase's compiled step for step index `step`'s batch."""
    previous, self._size = self._size, self._phase.batch_at(step)
    self.train_step, self._config_shape = self._phase_steps[
        (self._phase.index, self._size)]
    if self._phase.ramp and self._size != previous:
      logging.info("Global batch %d from step %d (%d tokens before it).",
                   self._size, step,
                   phases_lib.tokens_before(self.phases, step))

  def _next_batch(self) -> dict:
    """This host's rows of the next step (a warm-up step: as many pipeline
    batches as its size takes)."""
    if not self._phase.ramp:
      return next(self.train_iter)
    return self.train_iter.next_rows(self._size // jax.process_count())

  def _compile_eval(self, phase) -> None:
    """The eval step of `phase`'s model (the caller's evaluate compiles
    its own)."""
    if self._evaluate_fn is not None:
      return
    p = self.programs
    _, eval_step = p.steps_for(self._phase_config(phase))
    self.eval_step = compiled_lib.compile_ahead(
        eval_step, p.abstract_state["params"],
        p.batch_spec(self._eval_local_batch_size() * jax.process_count()),
        p.eval_rng(0), p.abstract_state.get("frozen")).executable

  def _train_step_for(self, batch):
    """The compiled step for this batch's shape: the config's shape is
    compiled at start-up; bucketed fine-tuning compiles each bucket once."""
    shape = batch["input_ids"].shape
    if shape == self._config_shape:
      return self.train_step  # Looked up here so that it can be wrapped.
    step = self._train_steps.get(shape)
    if step is None:
      spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype,
                                      sharding=self.batch_sharding)
              for k, v in batch.items()}
      with self._context():
        compiled = compiled_lib.compile_ahead(self.programs.train_step,
                                              self.abstract_state, spec)
      step = self._train_steps[shape] = compiled.executable
      logging.info("Compiled the train step for batch shape %s in %.1fs.",
                   shape, compiled.seconds)
    return step

  def _enter_phase(self, phase, step: int) -> None:
    """At a phase boundary: the next phase's pipeline (where it starts:
    train.phase_data), and its step, compiled at start-up."""
    consumed = self.train_iter.examples_consumed
    stats = dict(self.train_iter.stats)
    self.train_iter = self.data.train_iterator(self._phase_config(phase),
                                               self._unit_rows(phase))
    self.train_iter.stats.update(stats)
    where = "the pipeline again with its own seed"
    if self.config.train.phase_data == "continue":
      skipped = self.train_iter.continue_after(consumed)
      where = (f"after the {consumed} examples consumed ({skipped} batches "
               "skipped)")
    logging.info("Phase %d/%d from step %d: %s; data: %s.", phase.index + 1,
                 len(self.phases), step, phase.describe(), where)
    previous, self._phase = self._phase, phase
    self._use_batch(step)
    if phase.model != previous.model:
      with self._context():
        self._compile_eval(phase)

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
        self.train_iter = self.data.train_iterator(self._phase_config(phase),
                                                   self._unit_rows(phase))
        state = self.checkpointer.restore(step, self.abstract_state,
                                          self.train_iter, self.config)
        with self._context():
          self._compile_phase(phase)
          self._compile_eval(phase)
      self._use_batch(step)
      logging.info("Resumed from checkpoint step %d in %s.", step,
                   self.checkpointer.directory)
      return state
    with self._context():
      state = self.programs.warm_start(self.programs.init())
    if self._init_params_fn is not None:
      state = dict(state, params=self._init_params_fn(
          state["params"], self.abstract_state["params"]))
    elif self.config.train.init_from:
      state = dict(state, params=self._init_params(self.config.train.init_from))
    if "ema" in state:  # The average starts at the params the run starts at.
      state["ema"] = jax.tree.map(lambda x: x.copy(), state["params"])
    return state

  def _init_params(self, path: str):
    """Params only (new run from pretrained weights), onto the state's mesh."""
    try:
      source = pretrained.resolve(path)
      params, report = pretrained.load_params(
          source, self.config.model,
          abstract_params=self.abstract_state["params"],
          seed=self.config.train.seed, config=self.config)
    except (ValueError, FileNotFoundError) as e:
      raise type(e)(f"train.init_from: {e}") from None
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

  def predict(self, params, local_batch: dict, index: int = 0,
              frozen=None) -> tuple[dict, dict]:
    """(loss sums, predictions) of one eval batch, on the host: the
    objective's `predict` outputs for every row of the global batch (all
    processes' rows, in global order) and the sums its loss is made of.
    `local_batch` is this process's rows (extra keys are ignored); `index`
    picks the eval rng (`Programs.eval_rng`)."""
    if self.programs.predict_step is None:
      raise ValueError(f"objective {self.programs.objective.name!r} declares "
                       "no predictions (Objective.predict).")
    names = self.programs.objective.feature_spec(self.config)
    batch = sharding.global_batch({k: local_batch[k] for k in names},
                                  self.batch_sharding)
    with self._context():
      out = self.programs.predict_step(params, batch,
                                       self.programs.eval_rng(index), frozen)
    return jax.device_get(out)

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
    flops_per_step = compose.train_flops_per_step(phase_config)
    peak, peak_source = utilization.peak_tflops(
        config.model.dtype, train.peak_tflops)
    logging.info("%.3g training TFLOPs per step at full rows; peak %.1f "
                 "TFLOP/s per device (%s, %s). MFU counts the real work: real "
                 "tokens, each sequence's own attention, the real masked "
                 "positions.", flops_per_step / 1e12, peak, peak_source,
                 config.model.dtype)
    if len(self.phases) > 1:
      logging.info("Phases: %s (learning-rate schedule %s).", "; ".join(
          f"{p.index + 1}: steps {p.start}-{p.end} at {p.describe()}"
          for p in self.phases), train.phase_schedule)
    last_metrics: dict[str, Any] = {}
    if start_step >= train.num_steps:
      logging.info("Checkpoint is at step %d >= train.num_steps=%d: nothing "
                   "to do.", start_step, train.num_steps)
    throughput = utilization.Throughput(peak)
    window = []  # (loss, finite) of the steps since the last log line.
    for step in range(start_step, train.num_steps):
      if step >= self._phase.end:
        self._enter_phase(phases_lib.at_step(self.phases, step), step)
        phase_config = self._phase_config(self._phase)
        throughput.restart()
      if self._phase.batch_at(step) != self._size:  # A warm-up's next size.
        self._use_batch(step)
      batch = sharding.global_batch(self._next_batch(), self.batch_sharding)
      state, metrics = self._train_step_for(batch)(state, batch)
      throughput.add(metrics.pop("work"))
      done = step + 1
      self.checkpointer.check_for_errors()  # A failed async save stops here.
      self._nonfinite.observe(done, metrics["finite"])
      window.append((metrics["loss"], metrics["finite"]))  # No host sync.
      is_last = done == train.num_steps
      if done % train.log_every == 0 or is_last:
        metrics = jax.device_get(metrics)
        rates = throughput.read(phase_config)
        metrics.update(_window_loss(jax.device_get(window), done))
        window = []
        self._nonfinite.flush()  # Apply train.nonfinite_policy so far.
        metrics = {k: float(v) for k, v in metrics.items() if k != "finite"}
        metrics.update(rates)
        if self._planned:  # Batch size and tokens as the phases plan them.
          metrics.update(batch_size=float(self._size), tokens_seen=float(
              phases_lib.tokens_before(self.phases, done)))
        eta = (train.num_steps - done) / max(rates["steps_per_sec"], 1e-9)
        logging.info(
            "step %d/%d  %s  lr %.2e  grad_norm %.3f  tokens/s %.0f real "
            "(%.1f%% of slots)  MFU %.1f%%  ETA %s", done, train.num_steps,
            self._format(metrics), metrics["learning_rate"],
            metrics["grad_norm"], rates["real_tokens_per_sec"],
            100 * rates["packing_efficiency"], 100 * rates["mfu"],
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
        last_metrics = {**last_metrics, "eval_step": done,
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


def _window_loss(window, done: int) -> dict:
  """The mean training loss over the steps since the last log line (the
  last train.log_every steps, fewer at the end), finite steps only: one
  batch's loss is noise, this is the number a summary reports."""
  losses = [float(l) for l, finite in window if bool(finite)]
  return dict(window_loss=float(np.mean(losses)) if losses else float("nan"),
              window_first_step=done - len(window) + 1,
              window_steps=len(losses))


def run_trainer(trainer: Trainer, lock) -> dict:
  """Run `trainer` under the workdir `lock` (checked before every save)."""
  trainer.checkpointer.guard = lock.verify
  try:
    return trainer.run()
  finally:
    trainer.shutdown()


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       take_over_workdir: bool = False,
                       overrides=None) -> dict:
  """Train per `config` in `workdir`, resuming from its latest checkpoint.

  `overrides` (the config fields the user set, e.g. "model.hidden_size"):
  given, train.init_from's model config replaces the config's where the
  user set nothing (``start_from.adopt_architecture``); None: the config's
  model must be the source's. Every check runs before anything is written;
  then the run takes the workdir (`workdir_lock`: a second run on it is
  refused before it writes).
  """
  if overrides is not None:
    config = start_from.adopt_architecture(config, overrides)
  phases = config_checks.validate(config, jax.device_count(),
                                  jax.process_count())
  config = start_from.resolve(config, workdir)  # The tokenizer of init_from.
  with workdir_lock.hold(workdir, take_over=take_over_workdir) as lock:
    return run_trainer(Trainer(config, workdir, phases=phases), lock)
