"""Optimizer: AdamW or LAMB, linear warmup then linear decay, clipping.

Weight decay skips LayerNorm parameters and biases, as in BERT. The run's
schedule is built once (`learning_rate_schedule`) and handed to the optimizer;
the rate a step logs is read back from the optimizer's own step count
(`learning_rate`), so the log shows the rate the update applied.
"""

import jax
import ml_collections
import optax


def learning_rate_schedule(train: ml_collections.ConfigDict,
                           phases=None) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then linear decay to 0 at `num_steps`.

  With several `phases` (`bert_jax.phases`) and train.phase_schedule
  "per_phase" (NVIDIA's recipe), each phase warms up to its own learning
  rate and decays to 0 at its own end; "continuous" is one schedule over all
  steps (google-research/bert).
  """
  if phases and len(phases) > 1 and train.phase_schedule == "per_phase":
    return optax.join_schedules(
        [_warmup_then_decay(p.learning_rate, p.warmup_steps, p.num_steps)
         for p in phases], boundaries=[p.start for p in phases[1:]])
  return _warmup_then_decay(train.learning_rate, train.warmup_steps,
                            train.num_steps)


def _warmup_then_decay(peak: float, warmup_steps: int,
                       num_steps: int) -> optax.Schedule:
  warmup = max(0, min(int(warmup_steps), int(num_steps)))
  decay = max(1, int(num_steps) - warmup)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, max(1, warmup)),
       optax.linear_schedule(peak, 0.0, decay)],
      boundaries=[warmup])


def decay_mask(params):
  """True for kernels and embeddings; False for biases and LayerNorm params."""

  def decays(path, _):
    names = [str(getattr(k, "key", k)) for k in path]
    return not (names[-1] == "bias" or "layer_norm" in names)

  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(train: ml_collections.ConfigDict,
                   schedule: optax.Schedule | None = None
                   ) -> optax.GradientTransformation:
  """Clipping, then AdamW or LAMB stepping by `schedule` (the run's, from
  `learning_rate_schedule`; None: the single-phase schedule of `train`)."""
  if schedule is None:
    schedule = learning_rate_schedule(train)
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
                     "'adamw', 'lamb'.")
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
