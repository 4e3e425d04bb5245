"""Sharded train state and the jitted train / eval / predict steps.

Read top to bottom: State, Update step, Eval and predict steps, Programs.
The steps are pure functions of (state, batch) for any objective, jitted
with explicit in/out shardings and donated state; the model is rebuilt
inside the trace from its static graphdef and the params pytree. The loop
that drives them is ``training/trainer.py``.
"""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from flax import nnx

from bert_jax import compose
from bert_jax import pretrained
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.data import features
from bert_jax.training import cached_gradients
from bert_jax.training import optim
from bert_jax.training import phases as phases_lib
from bert_jax.training import sharding


# ==============================================================================
# State: created directly sharded (eval_shape -> shardings -> jitted init).
# ==============================================================================
def abstract_model(config: ml_collections.ConfigDict, objective=None):
  objective = objective or compose.objective(config)
  return nnx.eval_shape(lambda: objective.make_model(config, nnx.Rngs(0)))


def abstract_frozen(config, objective):
  """The objective's fixed module (a teacher) as shapes, or None."""
  if objective.teacher is None:
    return None
  return nnx.eval_shape(
      lambda: objective.teacher.make_model(config, nnx.Rngs(0)))


def init_state_fn(config, objective, tx):
  """A function () -> train state; jitted with out_shardings, never run eagerly.

  Objectives with fixed params (a `teacher`) get them as state["frozen"]:
  carried through every step unchanged, checkpointed with the rest. With
  train.ema_decay, state["ema"] is the params' moving average.
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
    if config.train.get("ema_decay", 0.0):
      state["ema"] = jax.tree.map(jnp.copy, params)
    if objective.teacher is not None:  # Salt 2 is the eval rng's.
      frozen = objective.teacher.make_model(
          config, nnx.Rngs(params=jax.random.fold_in(root, 3)))
      state["frozen"] = nnx.state(frozen, nnx.Param).to_pure_dict()
    return state

  return init


def state_shardings(mesh, tx, abstract_state, params_sharding,
                    frozen_sharding=None) -> dict:
  """The train state's shardings: params (and frozen params) as their
  logical names map onto the mesh, optimizer moments and the params' moving
  average like their parameter, scalars replicated."""
  rep = sharding.replicated(mesh)
  out = dict(
      step=rep, rng=rep, params=params_sharding,
      opt_state=sharding.opt_state_shardings(tx, abstract_state["opt_state"],
                                             params_sharding, mesh),
      nonfinite_steps=rep, nonfinite_in_a_row=rep)
  if frozen_sharding is not None:
    out["frozen"] = frozen_sharding
  if "ema" in abstract_state:
    out["ema"] = params_sharding
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
def batch_work(batch) -> dict:
  """What a global batch holds, for throughput and MFU (``models/flops.py``,
  real work): {tokens, attended, predictions, slots} as float32 sums.

  tokens: real (input_mask) tokens; attended: sum over the batch's sequences
  of L^2 (a packed row's sequences counted apart, by `sequence_ids`);
  predictions: weighted MLM positions (0 without an MLM); slots: B x T.
  """
  mask = batch["input_mask"] > 0
  if "sequence_ids" in batch and "cls_positions" in batch:
    ids = batch["sequence_ids"]
    s = batch["cls_positions"].shape[-1]
    which = ids[..., None] == jnp.arange(1, s + 1, dtype=ids.dtype)
    lengths = jnp.sum(which, axis=1, dtype=jnp.float32)  # [B, S]
  else:
    lengths = jnp.sum(mask, axis=-1, dtype=jnp.float32)  # [B]
  weights = batch.get("masked_lm_weights")
  return dict(
      tokens=jnp.sum(mask, dtype=jnp.float32),
      attended=jnp.sum(lengths * lengths),
      predictions=(jnp.zeros((), jnp.float32) if weights is None else
                   jnp.sum(weights, dtype=jnp.float32)),
      slots=jnp.asarray(mask.size, jnp.float32))


def _microbatches(batch, k: int):
  """[B, ...] -> [k, B/k, ...] taking every k-th row, so that each microbatch
  is spread over all data-parallel devices rather than living on a few."""
  def split(x):
    x = x.reshape((x.shape[0] // k, k) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, batch)


def train_step(state, batch, *, graphdef, tx, schedule, config, objective,
               frozen_graphdef=None):
  """One optimizer update on a global batch; returns (state, metrics).

  The objective's loss is normalised by counts of the whole global batch,
  so gradient accumulation and any mesh give the same update; with
  train.cache_chunk_size an objective with a split loss takes the cached-
  gradient path (``cached_gradients``), the same update in chunks. `schedule` is
  the one `tx` steps by: the logged learning rate is it at the optimizer's
  own count (`optim.learning_rate`), the rate this update applies.
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
  if int(config.train.get("cache_chunk_size", 0)):
    grads, sums = cached_gradients.gradients(
        params, batch, key, counts, graphdef=graphdef, objective=objective,
        config=config)
  elif accum == 1:
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

  # A non-finite loss or gradient never reaches the weights: the update is
  # dropped and counted; the loop applies the configured policy. A branch,
  # not a select between the new and the old state: a select keeps the old
  # optimizer moments alive beside the new ones, and XLA copies every moment
  # (twice the parameters, read and written) each step to update them in
  # place.
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

  def update(operand):
    grads, opt_state, params = operand
    updates, new_opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), new_opt_state

  new_params, new_opt_state = jax.lax.cond(
      finite, update, lambda operand: (operand[2], operand[1]),
      (grads, state["opt_state"], params))
  new_state = dict(
      step=step + 1,
      rng=state["rng"],
      params=new_params,
      opt_state=new_opt_state,
      nonfinite_steps=state["nonfinite_steps"] + (~finite).astype(jnp.int32),
      nonfinite_in_a_row=jnp.where(finite, 0, state["nonfinite_in_a_row"] + 1),
  )
  if "frozen" in state:
    new_state["frozen"] = state["frozen"]
  if "ema" in state:  # The moving average of the params the updates kept.
    d = float(config.train.ema_decay)
    new_state["ema"] = jax.lax.cond(
        finite, lambda ema: jax.tree.map(
            lambda e, p: d * e + (1.0 - d) * p, ema, new_params),
        lambda ema: ema, state["ema"])
  metrics = dict(objective.metrics(sums, counts, config),
                 learning_rate=optim.learning_rate(schedule,
                                                   state["opt_state"]),
                 grad_norm=grad_norm, finite=finite,
                 work=batch_work(batch))
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
# Eval and predict steps: per-batch sums (added up on the host) and, for
# objectives that declare them, per-example predictions.
# ==============================================================================
def eval_step(params, batch, rng, frozen=None, *, graphdef, config, objective,
              frozen_graphdef=None):
  """Sums of one eval batch; `rng` only feeds objectives that sample;
  `frozen` is state["frozen"] for objectives that hold fixed params."""
  model = nnx.merge(graphdef, params)
  return objective.loss_sums(model, batch, jax.random.wrap_key_data(rng),
                             True, config,
                             **_frozen_kwargs(frozen, frozen_graphdef))


def predict_step(params, batch, rng, frozen=None, *, graphdef, config,
                 objective, frozen_graphdef=None):
  """(eval sums, predictions) of one batch: `eval_step`'s sums (the loss an
  evaluator reports is the train step's, from the same `loss_sums`) and the
  objective's `predict` outputs, one entry per row of the global batch, for
  evaluators that score every example (task metrics, predictions files)."""
  sums = eval_step(params, batch, rng, frozen, graphdef=graphdef,
                   config=config, objective=objective,
                   frozen_graphdef=frozen_graphdef)
  model = nnx.merge(graphdef, params)
  return sums, objective.predict(model, batch, config)


# ==============================================================================
# Jitted programs for a config on a mesh (used by the Trainer, tests, tools).
# ==============================================================================
class Programs:
  """State shardings plus jitted init / train / eval / predict steps on a mesh.

  Everything a step needs is derived here once: the phases' learning-rate
  schedule and the optimizer stepping by it, the sharding rules, the
  abstract model(s) with their graphdefs and param shardings, the state's
  shardings and the batch sharding. `train_step`, `eval_step` and
  `predict_step` (None for objectives without `predict`) are `jax.jit`
  objects (call them, or `.lower(...).compile()` them); run them inside
  `self.context()` so that activation constraints see the mesh and rules.
  A phase whose model fields differ (context extension's RoPE base) gets its
  own steps over the same state (`steps_for`).
  """

  def __init__(self, config: ml_collections.ConfigDict, mesh, objective=None,
               *, phases=None):
    """`objective` defaults to the one `config.objective.name` names,
    `phases` to `phases.resolve(config)` (a run passes the ones it resolved
    while checking the config)."""
    self.config, self.mesh = config, mesh
    self.objective = objective = objective or compose.objective(config)
    self.phases = phases_lib.resolve(config) if phases is None else phases
    self.rules = sharding.rules(config.mesh)
    # ---- Optimizer: one schedule, applied by the update and logged from it.
    self.schedule = optim.learning_rate_schedule(config.train, self.phases)
    self.tx = optim.make_optimizer(config.train, self.schedule)
    # ---- Abstract model(s): graphdefs and param shardings.
    self.graphdef, abstract_params = nnx.split(
        abstract_model(config, objective), nnx.Param)
    self._params_sharding = sharding.param_shardings(abstract_params, mesh,
                                                     self.rules)
    frozen = abstract_frozen(config, objective)
    self.frozen_graphdef, self._frozen_sharding = None, None
    if frozen is not None:
      self.frozen_graphdef, abstract_frozen_params = nnx.split(frozen,
                                                               nnx.Param)
      self._frozen_sharding = sharding.param_shardings(
          abstract_frozen_params, mesh, self.rules)
    # ---- State and batch shardings.
    init = init_state_fn(config, objective, self.tx)
    abstract_state = jax.eval_shape(init)
    self.state_sharding = state_shardings(mesh, self.tx, abstract_state,
                                          self._params_sharding,
                                          self._frozen_sharding)
    self.abstract_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        abstract_state, self.state_sharding)
    self.batch_sharding = sharding.batch_sharding(mesh)
    # ---- Jitted steps.
    self.init = jax.jit(init, out_shardings=self.state_sharding)
    self.train_step, self.eval_step, self.predict_step = self._jit_steps(
        config, self.graphdef)
    self._phase_steps = {}  # Model config (JSON) -> (train, eval) steps.

  def _jit_steps(self, config, graphdef):
    """(train, eval, predict or None) steps of `config`'s model graph."""
    replicated = sharding.replicated(self.mesh)
    train = jax.jit(
        functools.partial(train_step, graphdef=graphdef, tx=self.tx,
                          schedule=self.schedule, config=config,
                          objective=self.objective,
                          frozen_graphdef=self.frozen_graphdef),
        in_shardings=(self.state_sharding, self.batch_sharding),
        out_shardings=(self.state_sharding, replicated),
        donate_argnums=(0,))
    model_kwargs = dict(graphdef=graphdef, config=config,
                        objective=self.objective,
                        frozen_graphdef=self.frozen_graphdef)
    eval_in = (self._params_sharding, self.batch_sharding, replicated,
               self._frozen_sharding)
    evaluate = jax.jit(functools.partial(eval_step, **model_kwargs),
                       in_shardings=eval_in, out_shardings=replicated)
    # Predictions come back replicated: every process sees every row.
    predict = None if self.objective.predict is None else jax.jit(
        functools.partial(predict_step, **model_kwargs),
        in_shardings=eval_in, out_shardings=replicated)
    return train, evaluate, predict

  def steps_for(self, config):
    """(train_step, eval_step) for a phase's config (`phases.phase_config`):
    this run's own unless the phase overrides model fields (e.g. a larger
    RoPE base), which then get their own graph over the same state."""
    if config.model.to_dict() == self.config.model.to_dict():
      return self.train_step, self.eval_step
    key = json.dumps(config.model.to_dict(), sort_keys=True)
    if key not in self._phase_steps:
      graphdef = nnx.split(abstract_model(config, self.objective),
                           nnx.Param)[0]
      self._phase_steps[key] = self._jit_steps(config, graphdef)[:2]
    return self._phase_steps[key]

  def warm_start(self, state):
    """A fresh state with the objective's teacher loaded (a random one
    kept as initialized) and the student initialized from it; unchanged
    without a teacher."""
    teacher = self.objective.teacher
    if teacher is None:
      return state
    path = teacher.path(self.config)
    if path:
      frozen, report = pretrained.load_params(
          pretrained.resolve(path), self.config.model,
          seed=self.config.train.seed)
      if report.fresh:
        logging.warning("The teacher %s lacks %s (initialized randomly): its "
                        "outputs are noise there.", path, report.fresh)
      logging.info("Teacher (%s): %s", teacher.field, report.summary())
    else:
      logging.warning("%s: the teacher is randomly initialized (for tests "
                      "and smoke runs only).", teacher.field)
      frozen = jax.device_get(state["frozen"])
    params = teacher.init_student(self.config, frozen)
    return dict(
        state, params=checkpoint_reading.place_params(
            params, self.abstract_state["params"], source="warm_start"),
        frozen=checkpoint_reading.place_params(
            frozen, self.abstract_state["frozen"], source=path or "random"))

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
        max_predictions or self.config.data.max_predictions_per_seq,
        int(self.config.data.get("packing_max_sequences", 0)))
    return {k: jax.ShapeDtypeStruct(s, d, sharding=self.batch_sharding)
            for k, (s, d) in shapes.items()}
