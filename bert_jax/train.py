"""BERT pretraining: sharded state, jitted train/eval steps and the loop.

Read top to bottom: Config checks, Mesh, State, Loss, Update step, Eval step,
Logging, Loop. The steps are pure functions of (state, batch) jitted with
explicit in/out shardings and donated state; the model is rebuilt inside the
trace from its static graphdef and the params pytree.
"""

from __future__ import annotations

import functools
import json
import os
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
from bert_jax import features
from bert_jax import flops as flops_lib
from bert_jax import model as model_lib
from bert_jax import optim
from bert_jax import preemption
from bert_jax import sharding



# ==============================================================================
# Config checks.
# ==============================================================================
def validate_config(config: ml_collections.ConfigDict, num_devices: int) -> None:
  """Stop at startup with one sentence naming the field, not mid-run."""
  model_lib.validate_model_config(config.model)
  d, t = config.data, config.train
  if d.seq_length > config.model.max_position_embeddings:
    raise ValueError(
        f"data.seq_length={d.seq_length} exceeds "
        f"model.max_position_embeddings={config.model.max_position_embeddings}.")
  if not 0 < d.max_predictions_per_seq <= d.seq_length:
    raise ValueError(
        f"data.max_predictions_per_seq={d.max_predictions_per_seq} must be in "
        f"[1, data.seq_length={d.seq_length}].")
  if t.num_steps <= 0 or t.batch_size <= 0:
    raise ValueError(f"train.num_steps={t.num_steps} and train.batch_size="
                     f"{t.batch_size} must be positive.")
  mesh_shape = dict(zip(sharding.MESH_AXES,
                        sharding.mesh_shape(config.mesh, num_devices)))
  dp = mesh_shape["data"] * mesh_shape["fsdp"]
  accum = t.get("grad_accum_steps", 1)
  if t.batch_size % (dp * accum):
    raise ValueError(
        f"train.batch_size={t.batch_size} is not divisible by the "
        f"data-parallel size (mesh.data*mesh.fsdp={dp}) times "
        f"train.grad_accum_steps={accum}.")
  if t.batch_size % jax.process_count():
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by the "
                     f"process count {jax.process_count()}.")
  heads, tp = config.model.num_attention_heads, mesh_shape["tensor"]
  if heads % tp:
    raise ValueError(f"model.num_attention_heads={heads} is not divisible by "
                     f"mesh.tensor={tp}.")


# ==============================================================================
# State: created directly sharded (eval_shape -> shardings -> jitted init).
# ==============================================================================
def abstract_model(model_config: ml_collections.ConfigDict):
  return nnx.eval_shape(
      lambda: model_lib.BertForPreTraining(model_config, rngs=nnx.Rngs(0)))


def init_state_fn(model_config, tx, seed: int):
  """A function () -> train state; jitted with out_shardings, never run eagerly."""

  def init():
    root = jax.random.key(seed)
    model = model_lib.BertForPreTraining(
        model_config, rngs=nnx.Rngs(params=jax.random.fold_in(root, 0)))
    params = nnx.state(model, nnx.Param).to_pure_dict()
    return dict(
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.key_data(jax.random.fold_in(root, 1)),
        params=params,
        opt_state=tx.init(params),
        nonfinite_steps=jnp.zeros((), jnp.int32),
        nonfinite_in_a_row=jnp.zeros((), jnp.int32),
    )

  return init


def state_shardings(config, mesh, tx, abstract_state):
  graphdef, abs_params = nnx.split(abstract_model(config.model), nnx.Param)
  del graphdef
  params = sharding.param_shardings(abs_params, mesh,
                                    sharding.rules(config.mesh))
  rep = sharding.replicated(mesh)
  return dict(
      step=rep, rng=rep, params=params,
      opt_state=sharding.opt_state_shardings(tx, abstract_state["opt_state"],
                                             params, mesh),
      nonfinite_steps=rep, nonfinite_in_a_row=rep)


# ==============================================================================
# Loss.
# ==============================================================================
def forward(graphdef, params, batch, dropout_key=None):
  model = nnx.merge(graphdef, params)
  rngs = None if dropout_key is None else nnx.Rngs(dropout=dropout_key)
  return model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
               batch["masked_lm_positions"],
               deterministic=dropout_key is None, rngs=rngs)


def loss_sums(outputs, batch):
  """Per-batch sums (not means), so that any split of the batch adds up."""
  logits = outputs["mlm_logits"].astype(jnp.float32)
  ids, w = batch["masked_lm_ids"], batch["masked_lm_weights"]
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, ids[..., None], axis=-1)[..., 0]
  nsp_logits = outputs["nsp_logits"].astype(jnp.float32)
  labels = batch["next_sentence_labels"]
  nsp_nll = -jnp.take_along_axis(jax.nn.log_softmax(nsp_logits),
                                 labels[:, None], axis=-1)[:, 0]
  return dict(
      mlm_loss=jnp.sum(nll * w),
      mlm_correct=jnp.sum((jnp.argmax(logits, -1) == ids) * w),
      mlm_weight=jnp.sum(w),
      nsp_loss=jnp.sum(nsp_nll),
      nsp_correct=jnp.sum(jnp.argmax(nsp_logits, -1) == labels).astype(
          jnp.float32),
      nsp_count=jnp.asarray(labels.shape[0], jnp.float32),
  )


def objective(sums, mlm_denominator, nsp_denominator, use_nsp: bool):
  """Global normalisation: MLM sum / global masked count (+ NSP mean)."""
  loss = sums["mlm_loss"] / mlm_denominator
  if use_nsp:
    loss = loss + sums["nsp_loss"] / nsp_denominator
  return loss


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


def train_step(state, batch, *, graphdef, tx, config):
  """One optimizer update on a global batch; returns (state, metrics)."""
  use_nsp = bool(config.data.nsp)
  accum = int(config.train.get("grad_accum_steps", 1))
  step = state["step"]
  key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), step)
  mlm_den = jnp.maximum(jnp.sum(batch["masked_lm_weights"]), 1.0)
  nsp_den = jnp.asarray(batch["next_sentence_labels"].shape[0], jnp.float32)

  def loss_fn(params, micro, micro_key):
    sums = loss_sums(forward(graphdef, params, micro, micro_key), micro)
    return objective(sums, mlm_den, nsp_den, use_nsp), sums

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
    zeros_s = jax.tree.map(lambda x: jnp.zeros((), jnp.float32),
                           loss_sums_shape())
    (grads, sums), _ = jax.lax.scan(
        body, (zeros_g, zeros_s), (_microbatches(batch, accum),
                                   jnp.arange(accum)))

  loss = objective(sums, mlm_den, nsp_den, use_nsp)
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
  schedule = optim.learning_rate_schedule(config.train)
  metrics = dict(
      loss=loss,
      mlm_loss=sums["mlm_loss"] / mlm_den,
      mlm_accuracy=sums["mlm_correct"] / mlm_den,
      nsp_loss=sums["nsp_loss"] / nsp_den,
      nsp_accuracy=sums["nsp_correct"] / nsp_den,
      learning_rate=schedule(step),
      grad_norm=grad_norm,
      finite=finite,
  )
  return new_state, metrics


def loss_sums_shape():
  return dict.fromkeys(("mlm_loss", "mlm_correct", "mlm_weight", "nsp_loss",
                        "nsp_correct", "nsp_count"), 0.0)


# ==============================================================================
# Eval step.
# ==============================================================================
def eval_step(params, batch, *, graphdef):
  return loss_sums(forward(graphdef, params, batch), batch)


def summarize_eval(sums: dict) -> dict:
  mlm_den = max(sums["mlm_weight"], 1.0)
  nsp_den = max(sums["nsp_count"], 1.0)
  return dict(
      mlm_loss=sums["mlm_loss"] / mlm_den,
      mlm_accuracy=sums["mlm_correct"] / mlm_den,
      nsp_loss=sums["nsp_loss"] / nsp_den,
      nsp_accuracy=sums["nsp_correct"] / nsp_den,
  )


# ==============================================================================
# Jitted programs for a config on a mesh (used by the Trainer, tests, tools).
# ==============================================================================
class Programs:
  """State shardings plus jitted init / train_step / eval_step on a mesh.

  `train_step` and `eval_step` are `jax.jit` objects (call them, or
  `.lower(...).compile()` them); run them inside `self.context()` so that
  activation constraints see the mesh and rules.
  """

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    self.rules = sharding.rules(config.mesh)
    self.tx = optim.make_optimizer(config.train)
    self.graphdef = nnx.split(abstract_model(config.model), nnx.Param)[0]
    init = init_state_fn(config.model, self.tx, config.train.seed)
    abstract_state = jax.eval_shape(init)
    self.state_sharding = state_shardings(config, mesh, self.tx,
                                          abstract_state)
    self.abstract_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract_state, self.state_sharding)
    self.batch_sharding = sharding.batch_sharding(mesh)
    replicated = sharding.replicated(mesh)
    self.init = jax.jit(init, out_shardings=self.state_sharding)
    self.train_step = jax.jit(
        functools.partial(train_step, graphdef=self.graphdef, tx=self.tx,
                          config=config),
        in_shardings=(self.state_sharding, self.batch_sharding),
        out_shardings=(self.state_sharding, replicated),
        donate_argnums=(0,))
    self.eval_step = jax.jit(
        functools.partial(eval_step, graphdef=self.graphdef),
        in_shardings=(self.state_sharding["params"], self.batch_sharding),
        out_shardings=replicated)

  def context(self):
    return sharding.logical_context(self.mesh, self.rules)

  def batch_spec(self, global_batch_size: int) -> dict:
    """ShapeDtypeStructs of a global batch, for ahead-of-time lowering."""
    shapes = features.batch_shapes(
        features.PRETRAINING, global_batch_size, self.config.data.seq_length,
        self.config.data.max_predictions_per_seq)
    return {k: jax.ShapeDtypeStruct(s, d, sharding=self.batch_sharding)
            for k, (s, d) in shapes.items()}


# ==============================================================================
# Logging: absl lines, metrics.jsonl and TensorBoard.
# ==============================================================================
class MetricsWriter:
  """One JSON object per logged step in metrics.jsonl, plus TensorBoard.

  The workdir may be any tf.io.gfile path (local or gs://): metrics.jsonl
  is appended through tf.io.gfile. TensorBoard events go through
  tensorboardX, which writes local paths and gs:// (with the
  google-cloud-storage package); elsewhere they are skipped with a warning.
  """

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._tb = {}
    if not enabled:
      return
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    self._jsonl = tf.io.gfile.GFile(os.path.join(workdir, "metrics.jsonl"),
                                    "a")
    self._tb = _tensorboard_writers(workdir)

  def write(self, step: int, split: str, metrics: dict):
    if not self.enabled:
      return
    record = {"step": int(step), "split": split}
    record.update({k: float(v) for k, v in metrics.items()})
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    if split in self._tb:
      for k, v in metrics.items():
        self._tb[split].add_scalar(k, float(v), int(step))
      self._tb[split].flush()

  def close(self):
    if self.enabled:
      self._jsonl.close()
      for tb in self._tb.values():
        tb.close()


def _tensorboard_writers(workdir: str) -> dict:
  """{split: tensorboardX.SummaryWriter}, or {} where it cannot write."""
  import tensorboardX  # Event files without importing TensorFlow.
  scheme = workdir.split("://")[0] if "://" in workdir else ""
  if scheme not in ("", "gs", "s3"):
    logging.warning("TensorBoard events are not written to %s:// workdirs "
                    "(metrics.jsonl is).", scheme)
    return {}
  try:
    return {split: tensorboardX.SummaryWriter(
        os.path.join(workdir, "tensorboard", split))
            for split in ("train", "eval")}
  except Exception as e:  # pylint: disable=broad-except
    logging.warning("TensorBoard events are not written (%s); for gs:// "
                    "install google-cloud-storage. metrics.jsonl is.", e)
    return {}


def unigram_baseline(batches, vocab_size: int) -> float:
  """Held-out MLM accuracy of always predicting the most frequent target.

  The most frequent token is taken from the held-out targets themselves, so
  this is the best any context-free constant predictor can score. Counted
  over every process's eval rows, like the eval metrics it is shown next to.
  """
  counts = np.zeros(vocab_size, np.float64)
  for b in batches:
    np.add.at(counts, np.asarray(b["masked_lm_ids"]).ravel(),
              np.asarray(b["masked_lm_weights"], np.float64).ravel())
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    counts = np.asarray(multihost_utils.process_allgather(
        counts.astype(np.float32))).reshape(-1, vocab_size).sum(0)
  total = counts.sum()
  return float(counts.max() / total) if total else 0.0


def format_duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


# ==============================================================================
# Loop.
# ==============================================================================
class Trainer:
  """Holds the mesh, compiled steps, state and data for one run."""

  def __init__(self, config: ml_collections.ConfigDict, workdir: str):
    from bert_jax import input_pipeline  # TensorFlow: only when training.

    self.config, self.workdir = config, workdir
    validate_config(config, jax.device_count())
    self.tokenizer = input_pipeline.load_tokenizer(config.data, workdir)
    input_pipeline.validate(config, self.tokenizer)

    # ---- Mesh.
    self.mesh = sharding.make_mesh(config.mesh)
    logging.info("Mesh %s over %d devices (%d processes).",
                 sharding.describe(self.mesh), jax.device_count(),
                 jax.process_count())

    # ---- Input.
    proc = dict(process_index=jax.process_index(),
                process_count=jax.process_count())
    self.train_iter = input_pipeline.create_train_iterator(
        config, self.tokenizer, workdir, **proc)
    self.eval_batches = input_pipeline.create_eval_batches(
        config, self.tokenizer, workdir, **proc)
    self.batch_sharding = sharding.batch_sharding(self.mesh)
    self.unigram_accuracy = unigram_baseline(self.eval_batches,
                                             config.model.vocab_size)

    # ---- Model, state shardings and compiled steps (ahead of time).
    self.programs = Programs(config, self.mesh)
    self.abstract_state = self.programs.abstract_state
    self.checkpointer = checkpointing.Checkpointer(workdir, config.checkpoint)
    self._compile()

  def _context(self):
    return self.programs.context()

  def _compile(self):
    p = self.programs
    start = time.time()
    with self._context():
      self.train_step = p.train_step.lower(
          p.abstract_state, p.batch_spec(self.config.train.batch_size)).compile()
      self.eval_step = p.eval_step.lower(
          p.abstract_state["params"],
          p.batch_spec(self._eval_local_batch_size() * jax.process_count())
      ).compile()
    self.compile_seconds = time.time() - start
    mem = self.train_step.memory_analysis()
    if mem is not None:
      logging.info(
          "Compiled train step in %.1fs; per-device memory: arguments %.1f MB, "
          "temporaries %.1f MB, outputs %.1f MB.", self.compile_seconds,
          mem.argument_size_in_bytes / 2**20, mem.temp_size_in_bytes / 2**20,
          mem.output_size_in_bytes / 2**20)

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
      logging.info("Resumed from checkpoint step %d in %s.", step,
                   self.checkpointer.directory)
      return state
    with self._context():
      state = self.programs.init()
    init_from = self.config.train.get("init_from", "")
    if init_from:
      state = dict(state, params=self._init_params(init_from))
    return state

  def _init_params(self, path: str):
    """Params only (new run from pretrained weights): our checkpoint or HF."""
    abstract = self.abstract_state["params"]
    try:
      checkpointing.resolve_step_dir(path)
      ours = True
    except FileNotFoundError:
      ours = False
    if ours:
      params, step = checkpointing.restore_params(path, abstract,
                                                  config=self.config)
      logging.info("train.init_from: params of %s (step %d).", path, step)
      return params
    from bert_jax import hf  # Hugging Face dir / converted weights.
    params, report = hf.load_init_params(path, self.config.model,
                                         seed=self.config.train.seed)
    logging.info("train.init_from: params of %s (%s).", path, report)
    return checkpointing.place_params(params, abstract, source=path)

  def evaluate(self, params) -> dict:
    totals = loss_sums_shape()
    for local in self.eval_batches:
      batch = sharding.global_batch(local, self.batch_sharding)
      sums = jax.device_get(self.eval_step(params, batch))
      totals = {k: totals[k] + float(sums[k]) for k in totals}
    return summarize_eval(totals)

  def run(self) -> dict:
    config, train = self.config, self.config.train
    state = self.initial_state()
    start_step = int(jax.device_get(state["step"]))
    # ---- Stop safely: non-finite policy and preemption (SIGTERM).
    self._nonfinite = preemption.NonFiniteMonitor(
        train.get("nonfinite_policy", "skip"),
        train.get("max_nonfinite_in_a_row", 10),
        in_a_row=int(jax.device_get(state["nonfinite_in_a_row"])),
        total=int(jax.device_get(state["nonfinite_steps"])))
    self._nonfinite.last_checkpoint = self.checkpointer.latest_step()
    self._preemption = preemption.PreemptionWatcher()
    writer = MetricsWriter(self.workdir, enabled=jax.process_index() == 0)
    tokens_per_step = train.batch_size * config.data.seq_length
    flops_per_step = flops_lib.train_flops_per_step(config)
    peak, peak_source = flops_lib.peak_tflops(
        config.model.dtype, train.get("peak_tflops", 0.0))
    logging.info("%.3g training TFLOPs per step; peak %.1f TFLOP/s per device "
                 "(%s, %s).", flops_per_step / 1e12, peak, peak_source,
                 config.model.dtype)
    last_metrics: dict[str, Any] = {}
    if start_step >= train.num_steps:
      logging.info("Checkpoint is at step %d >= train.num_steps=%d: nothing "
                   "to do.", start_step, train.num_steps)
    t_last, step_last = time.time(), start_step
    for step in range(start_step, train.num_steps):
      batch = sharding.global_batch(next(self.train_iter), self.batch_sharding)
      state, metrics = self.train_step(state, batch)
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
            "step %d/%d  loss %.4f  mlm_acc %.4f  nsp_acc %.4f  lr %.2e  "
            "grad_norm %.3f  tokens/s %.0f  MFU %.1f%%  ETA %s", done,
            train.num_steps, metrics["loss"], metrics["mlm_accuracy"],
            metrics["nsp_accuracy"], metrics["learning_rate"],
            metrics["grad_norm"], tps, 100 * metrics["mfu"],
            format_duration(eta))
        writer.write(done, "train", metrics)
        last_metrics = metrics
      if done % train.eval_every == 0 or is_last:
        eval_metrics = self.evaluate(state["params"])
        eval_metrics["loss"] = eval_metrics["mlm_loss"] + (
            eval_metrics["nsp_loss"] if config.data.nsp else 0.0)
        eval_metrics["unigram_accuracy"] = self.unigram_accuracy
        logging.info("eval step %d  mlm_loss %.4f  mlm_acc %.4f (unigram "
                     "baseline %.4f)  nsp_acc %.4f", done,
                     eval_metrics["mlm_loss"], eval_metrics["mlm_accuracy"],
                     self.unigram_accuracy, eval_metrics["nsp_accuracy"])
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


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, *,
                       take_over_workdir: bool = False) -> dict:
  """Train per `config` in `workdir`, resuming from its latest checkpoint.

  The run takes the workdir first (`workdir_lock`): a second run on it is
  refused before it writes anything.
  """
  from bert_jax import workdir_lock  # pylint: disable=g-import-not-at-top
  validate_config(config, jax.device_count())  # Before touching the workdir.
  lock = workdir_lock.take(workdir, take_over=take_over_workdir)
  try:
    checkpointing.check_workdir_shared(workdir)  # Multi-host: one storage.
    trainer = Trainer(config, workdir)
    trainer.checkpointer.guard = lock.verify  # Still ours? Before each save.
    try:
      return trainer.run()
    finally:
      trainer.shutdown()
  finally:
    lock.release()
