"""Optimizer: AdamW or LAMB, linear warmup then linear decay, clipping.

Weight decay skips LayerNorm parameters and biases, as in BERT.
"""

import jax
import ml_collections
import optax


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup to `learning_rate`, then linear decay to 0 at `num_steps`."""
  warmup = max(0, min(int(train.warmup_steps), int(train.num_steps)))
  decay = max(1, int(train.num_steps) - warmup)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, train.learning_rate, max(1, warmup)),
       optax.linear_schedule(train.learning_rate, 0.0, decay)],
      boundaries=[warmup])


def decay_mask(params):
  """True for kernels and embeddings; False for biases and LayerNorm params."""

  def decays(path, _):
    names = [str(getattr(k, "key", k)) for k in path]
    return not (names[-1] == "bias" or "layer_norm" in names)

  return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
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
