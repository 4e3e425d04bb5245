"""Optimizer: AdamW, LAMB or StableAdamW; linear warmup then linear decay
or warmup-stable-decay; global-norm clipping (not StableAdamW's).

Weight decay skips LayerNorm parameters and biases, as in BERT. The run's
schedule is built once (`learning_rate_schedule`) and handed to the optimizer;
the rate a step logs is read back from the optimizer's own step count
(`learning_rate`), so the log shows the rate the update applied.

StableAdamW (Wortsman et al. 2023; ModernBERT's optimizer, as optimi's
``StableAdamW``) is AdamW whose step size is divided, per tensor, by
max(1, RMS(g^2 / max(v_hat, eps^2))): a tensor whose gradient jumps far
above its running second moment takes a smaller step, instead of one global
gradient clip for all. Weight decay is AdamW's (times the clipped learning
rate); ModernBERT's "decoupled" decay wd_d (times lr / peak lr) is
weight_decay = wd_d / peak learning rate here.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bert_jax.training import phases as phases_lib

OPTIMIZERS = ("adamw", "lamb", "stable_adamw")
SCHEDULES = ("linear", "wsd")
SCHEDULE_UNITS = ("steps", "tokens")
DECAY_SHAPES = ("linear", "1-sqrt")


def learning_rate_schedule(train: ml_collections.ConfigDict,
                           phases=None) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then linear decay to 0 at `num_steps`.

  With several `phases` (`training/phases.py`) and train.phase_schedule
  "per_phase" (NVIDIA's recipe), each phase warms up to its own learning
  rate and decays to 0 at its own end; "continuous" is one schedule over all
  steps (google-research/bert). train.schedule_unit "tokens" counts the
  same shapes in tokens (`tokens_schedule`).
  """
  unit = train.get("schedule_unit", "steps")
  if unit not in SCHEDULE_UNITS:
    raise ValueError(f"train.schedule_unit={unit!r} is not one of "
                     f"{SCHEDULE_UNITS}.")
  if unit == "tokens":
    if not phases:
      raise ValueError("train.schedule_unit='tokens' counts the tokens of "
                       "the run's phases: pass them (phases.resolve).")
    return tokens_schedule(train, phases)
  if phases and len(phases) > 1 and train.phase_schedule == "per_phase":
    return optax.join_schedules(
        [_shaped(train, p.learning_rate, p.warmup_steps, p.num_steps,
                 getattr(p, "decay_steps", train.decay_steps))
         for p in phases], boundaries=[p.start for p in phases[1:]])
  return _shaped(train, train.learning_rate, train.warmup_steps,
                 train.num_steps, train.decay_steps)


def tokens_schedule(train: ml_collections.ConfigDict,
                    phases) -> optax.Schedule:
  """The schedule counted in tokens (batch x seq_length per step): the
  shape train.schedule names over the run's tokens (or, "per_phase", each
  phase's), warming up over `warmup_tokens` and decaying over the last
  `decay_tokens`. A step's rate is the curve at the tokens of the steps
  before it, so a batch that grows (a warm-up, a phase) moves along the
  curve faster per step without stretching it. Computed in float32 (1e-7
  relative: ~1e5 tokens at 1.7T)."""
  segments = phases_lib.segments(phases)
  first = jnp.asarray([f for f, _, _ in segments], jnp.float32)
  steps = jnp.asarray([n for _, n, _ in segments], jnp.float32)
  per = jnp.asarray([t for _, _, t in segments], jnp.float32)

  def tokens(count):
    done = jnp.clip(jnp.asarray(count, jnp.float32) - first, 0.0, steps)
    return jnp.sum(per * done)

  if len(phases) > 1 and train.phase_schedule == "per_phase":
    starts = [phases_lib.tokens_before(phases, p.start) for p in phases]
    curve = optax.join_schedules(
        [_shaped(train, p.learning_rate, p.warmup_tokens, p.tokens,
                 p.decay_tokens, "tokens") for p in phases],
        boundaries=starts[1:])
  else:
    curve = _shaped(
        train, train.learning_rate,
        phases_lib.whole_number(train.warmup_tokens, "train.warmup_tokens"),
        sum(p.tokens for p in phases),
        phases_lib.whole_number(train.decay_tokens, "train.decay_tokens"),
        "tokens")
  return lambda count: curve(tokens(count))


def _shaped(train, peak, warmup_steps, num_steps, decay_steps,
            unit: str = "steps"):
  """One span's schedule in the shape train.schedule names."""
  shape = train.get("schedule", "linear")
  if shape == "linear":
    return _warmup_then_decay(peak, warmup_steps, num_steps)
  if shape == "wsd":
    return warmup_stable_decay(peak, warmup_steps, decay_steps, num_steps,
                               train.get("decay_shape", "linear"), unit)
  raise ValueError(f"train.schedule={shape!r} is not one of {SCHEDULES}.")


def warmup_stable_decay(peak: float, warmup_steps: int, decay_steps: int,
                        num_steps: int, shape: str = "linear",
                        unit: str = "steps") -> optax.Schedule:
  """0 -> `peak` linearly over `warmup_steps`, `peak` until the last
  `decay_steps`, then down to 0 at `num_steps`: linearly, or as
  1 - sqrt(fraction of the decay) (shape "1-sqrt", Hägele et al. 2024).
  Past `num_steps`: 0 (or `peak` with no decay)."""
  if shape not in DECAY_SHAPES:
    raise ValueError(f"train.decay_shape={shape!r} is not one of "
                     f"{DECAY_SHAPES}.")
  num_steps = int(num_steps)
  warmup = max(0, min(int(warmup_steps), num_steps))
  decay = int(decay_steps)
  if not 0 <= decay <= num_steps - warmup:
    raise ValueError(f"train.decay_{unit}={decay_steps} must be in [0, "
                     f"{'num_steps' if unit == 'steps' else 'tokens'} - "
                     f"warmup_{unit} = {num_steps - warmup}].")
  start = num_steps - decay

  def schedule(count):
    step = jnp.asarray(count, jnp.float32)
    rise = peak * step / max(1, warmup)
    frac = jnp.clip((step - start) / max(1, decay), 0.0, 1.0)
    fall = 1.0 - (frac if shape == "linear" else jnp.sqrt(frac))
    lr = jnp.where(step < warmup, rise, peak * (fall if decay else 1.0))
    return lr.astype(jnp.float32)

  return schedule


def _warmup_then_decay(peak: float, warmup_steps: int,
                       num_steps: int) -> optax.Schedule:
  warmup = max(0, min(int(warmup_steps), int(num_steps)))
  decay = max(1, int(num_steps) - warmup)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(1, warmup)),
       optax.linear_schedule(peak, 0.0, decay)],
      boundaries=[warmup])


def decay_mask(params):
  """True for kernels and embeddings; False for biases and LayerNorm params
  (modules named layer_norm, norm or *_norm: BERT's and ModernBERT's)."""

  def decays(path, _):
    names = [str(getattr(k, "key", k)) for k in path]
    return not (names[-1] == "bias" or any(
        n == "layer_norm" or n == "norm" or n.endswith("_norm")
        for n in names))

  return jax.tree_util.tree_map_with_path(decays, params)


class StableAdamState(NamedTuple):
  count: jax.Array  # int32 steps taken.
  mu: optax.Updates  # First moments.
  nu: optax.Updates  # Second moments.


def scale_by_stable_adam(b1: float, b2: float, eps: float,
                         weight_decay: float = 0.0,
                         mask=None) -> optax.GradientTransformation:
  """Per tensor: (m_hat / (sqrt(v_hat) + eps) + wd * p [where `mask`]) /
  max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))), to be scaled by -lr."""

  def init(params):
    zeros = lambda: jax.tree.map(
        lambda p: jnp.zeros(p.shape, jnp.float32), params)
    return StableAdamState(jnp.zeros((), jnp.int32), zeros(), zeros())

  def update(grads, state, params=None):
    count = state.count + 1
    t = count.astype(jnp.float32)
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, state.nu,
                      grads)
    if params is None:
      params = jax.tree.map(jnp.zeros_like, grads)
    if mask is None:
      decays = jax.tree.map(lambda _: True, grads)
    else:
      decays = mask(params) if callable(mask) else mask

    def one(g, m, v, p, decay):
      m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
      rms = jnp.sqrt(jnp.mean(g * g / jnp.maximum(v_hat, eps * eps)))
      u = m_hat / (jnp.sqrt(v_hat) + eps)
      if weight_decay and decay:
        u = u + weight_decay * p
      return u / jnp.maximum(1.0, rms)

    updates = jax.tree.map(one, grads, mu, nu, params, decays)
    return updates, StableAdamState(count, mu, nu)

  return optax.GradientTransformation(init, update)


def stable_adamw(learning_rate, b1: float = 0.9, b2: float = 0.98,
                 eps: float = 1e-6, weight_decay: float = 0.0,
                 mask=None) -> optax.GradientTransformation:
  """StableAdamW (module docstring): no gradient clipping is needed."""
  return optax.chain(scale_by_stable_adam(b1, b2, eps, weight_decay, mask),
                     optax.scale_by_learning_rate(learning_rate))


def make_optimizer(train: ml_collections.ConfigDict,
                   schedule: optax.Schedule | None = None
                   ) -> optax.GradientTransformation:
  """Clipping, then AdamW or LAMB stepping by `schedule` (the run's, from
  `learning_rate_schedule`; None: the single-phase schedule of `train`);
  StableAdamW clips each tensor's update instead."""
  if schedule is None:
    schedule = learning_rate_schedule(train)
  if train.optimizer == "stable_adamw":  # Update clipping, no global clip.
    return stable_adamw(schedule, b1=train.adam_b1, b2=train.adam_b2,
                        eps=train.adam_eps, weight_decay=train.weight_decay,
                        mask=decay_mask)
  if train.optimizer == "adamw":
    opt = optax.adamw(schedule, b1=train.adam_b1, b2=train.adam_b2,
                      eps=train.adam_eps, weight_decay=train.weight_decay,
                      mask=decay_mask)
  elif train.optimizer == "lamb":
    opt = optax.lamb(schedule, b1=train.adam_b1, b2=train.adam_b2,
                     eps=train.adam_eps, weight_decay=train.weight_decay,
                     mask=decay_mask)
  else:
    raise ValueError(f"train.optimizer={train.optimizer!r} is not one of "
                     f"{', '.join(repr(o) for o in OPTIMIZERS)}.")
  return optax.chain(optax.clip_by_global_norm(train.max_grad_norm), opt)


def learning_rate(schedule: optax.Schedule, opt_state) -> jax.Array:
  """The rate the next update of `opt_state` applies: `schedule` at the count
  of the optimizer's own schedule state (optax's ScaleByScheduleState, which
  both AdamW and LAMB carry), not at the train step, which a dropped
  non-finite update advances while the optimizer's count stays."""
  counts = [s.count for s in jax.tree.leaves(
      opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByScheduleState))
            if isinstance(s, optax.ScaleByScheduleState)]
  if len(counts) != 1:
    raise ValueError(f"The optimizer state holds {len(counts)} learning-rate "
                     "schedule states; expected exactly one.")
  return schedule(counts[0])
