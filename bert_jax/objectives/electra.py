"""ELECTRA: replaced-token detection (Clark et al. 2020).

One step, as google-research/electra ``run_pretraining.py``:

1. The batch comes masked by the input pipeline (``masked_lm_positions``,
   ``masked_lm_ids`` = the original tokens, ``masked_lm_weights``; the
   ``input_ids`` carry [MASK] at masked positions; ELECTRA's configs mask
   85% [MASK] / 15% unchanged, no random tokens).
2. The generator (a small BERT MLM) gives logits at the masked positions; its
   loss is the usual MLM cross-entropy.
3. One token per masked position is sampled from those logits (temperature
   ``objective.generator_temperature``, the step's rng), without gradient.
4. The discriminator reads the ORIGINAL sequence with the samples written at
   the masked positions and labels every real token: 1 = replaced (sample !=
   original), 0 = original (a sample equal to the original counts as original).
5. loss = gen_weight * MLM mean over masked positions
          + disc_weight (50) * sigmoid BCE mean over non-padding tokens,
   both normalised by global counts.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from bert_jax.data import checks as data_checks
from bert_jax.data import features
from bert_jax.models import electra as electra_model
from bert_jax.models import flops as flops_lib
from bert_jax.objectives import Objective
from bert_jax.objectives import bert
from bert_jax.objectives import check_packed_input
from bert_jax.objectives import safe_div


def make_model(config, rngs: nnx.Rngs):
  return electra_model.ElectraForPreTraining(config, rngs=rngs)


def feature_spec(config):
  del config
  return features.PRETRAINING


def scatter_positions(ids, positions, weights, values):
  """`ids` [B,T] with `values` [B,P] written at `positions` where weight > 0.

  Padded prediction slots (weight 0, position 0 by convention) write
  nothing; a position listed twice (the maskers never do) takes the larger
  value, still a valid id. A one-hot compare over T instead of a scatter:
  elementwise and a reduction over P, so it shards along the batch like
  everything else.
  """
  t = ids.shape[-1]
  hit = (positions[..., None] == jnp.arange(t)) & (weights[..., None] > 0)
  written = jnp.any(hit, axis=1)
  value = jnp.max(jnp.where(hit, values[..., None], -1), axis=1)
  return jnp.where(written, value.astype(ids.dtype), ids), written


def step_keys(rng):
  """(sampling key, dropout key) of the rng `loss_sums` is given."""
  sample_key, dropout_key = jax.random.split(rng)
  return sample_key, dropout_key


def gumbel_noise(key, shape):
  """The Gumbel noise behind the generator's samples: `replace_tokens`
  takes argmax(logits / temperature + noise), which is exactly
  ``jax.random.categorical(key, logits / temperature)`` (the Gumbel-max
  trick, as jax implements it) with the noise in the open."""
  return jax.random.gumbel(key, shape, jnp.float32)


def sampling_noise(rng, shape):
  """The noise with which ``loss_sums(..., rng, ...)`` samples the generator
  at its [B, P, V] logits: a pure function of the step's rng, so that a test
  can hand the very draws of a train step to another implementation."""
  return gumbel_noise(step_keys(rng)[0], shape)


def replace_tokens(mlm_logits, batch, key, temperature: float):
  """Sample the generator and build the discriminator's input.

  Returns (disc_input_ids [B,T], labels [B,T] int32 1 = replaced, samples
  [B,P]). The originals are the batch's ``masked_lm_ids`` (``input_ids`` has
  [MASK] there); the samples carry no gradient.
  """
  logits = jax.lax.stop_gradient(mlm_logits.astype(jnp.float32))
  noise = gumbel_noise(key, logits.shape)
  samples = jnp.argmax(logits / temperature + noise, axis=-1).astype(jnp.int32)
  pos, w = batch["masked_lm_positions"], batch["masked_lm_weights"]
  original, _ = scatter_positions(batch["input_ids"], pos, w,
                                  batch["masked_lm_ids"])
  corrupted, _ = scatter_positions(original, pos, w, samples)
  labels = (corrupted != original).astype(jnp.int32)
  return corrupted, labels, samples


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  """Per-batch SUMS of both losses and of the counts behind every metric."""
  sample_key, dropout_key = step_keys(rng)
  rngs = None if deterministic else nnx.Rngs(dropout=dropout_key)
  mlm_logits = model.generator_logits(
      batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"], deterministic=deterministic,
      rngs=rngs).astype(jnp.float32)
  ids, w = batch["masked_lm_ids"], batch["masked_lm_weights"]
  corrupted, labels, samples = replace_tokens(
      mlm_logits, batch, sample_key, config.objective.generator_temperature)
  disc_logits = model.discriminator_logits(
      corrupted, batch["input_mask"], batch["segment_ids"],
      deterministic=deterministic, rngs=rngs)
  real = batch["input_mask"].astype(jnp.float32)
  y = labels.astype(jnp.float32)
  bce = optax.sigmoid_binary_cross_entropy(disc_logits, y)
  pred = (disc_logits > 0).astype(jnp.float32)
  return dict(
      **bert.mlm_sums(mlm_logits, batch),  # mlm_loss, mlm_correct, mlm_weight
      sampled_correct=jnp.sum((samples == ids) * w),
      disc_loss=jnp.sum(bce * real),
      disc_correct=jnp.sum((pred == y) * real),
      disc_true_positive=jnp.sum(pred * y * real),
      disc_predicted_positive=jnp.sum(pred * real),
      replaced=jnp.sum(y * real),
      disc_weight=jnp.sum(real),
  )


def counts(batch, config) -> dict:
  del config
  return dict(mlm_weight=jnp.sum(batch["masked_lm_weights"]),
              disc_weight=jnp.sum(batch["input_mask"].astype(jnp.float32)))


def loss(sums, counts_, config):
  obj = config.objective
  return (obj.gen_weight * safe_div(sums["mlm_loss"], counts_["mlm_weight"])
          + obj.disc_weight * safe_div(sums["disc_loss"],
                                       counts_["disc_weight"]))


def metrics(sums, counts_, config) -> dict:
  return dict(
      loss=loss(sums, counts_, config),
      mlm_loss=safe_div(sums["mlm_loss"], counts_["mlm_weight"]),
      mlm_accuracy=safe_div(sums["mlm_correct"], counts_["mlm_weight"]),
      sampled_accuracy=safe_div(sums["sampled_correct"], counts_["mlm_weight"]),
      disc_loss=safe_div(sums["disc_loss"], counts_["disc_weight"]),
      disc_accuracy=safe_div(sums["disc_correct"], counts_["disc_weight"]),
      disc_precision=safe_div(sums["disc_true_positive"],
                              sums["disc_predicted_positive"]),
      disc_recall=safe_div(sums["disc_true_positive"], sums["replaced"]),
      replaced_share=safe_div(sums["replaced"], counts_["disc_weight"]),
  )


def flops(config, work) -> float:
  """Both networks: the generator's encoder on every token plus its MLM head
  at the masked positions, and the discriminator's encoder plus its
  per-token head (dense d -> d -> 1) on every token."""
  gen = electra_model.generator_config(config)
  d = config.model.hidden_size
  return (flops_lib.encoder_flops(gen, work)
          + work.predictions * flops_lib.mlm_head_flops_per_position(gen)
          + flops_lib.encoder_flops(config.model, work)
          + work.tokens * 6.0 * (d * d + d))


def validate(config) -> None:
  """The pretraining pipeline's checks, then ELECTRA's own fields, before
  anything is written: the generator's size (objective.generator_hidden_size
  in (0, 1], heads that divide it) and packed input (no sentence-pair
  head)."""
  check_packed_input(config, "ELECTRA")  # First: the cause, not a symptom.
  data_checks.check_pretraining(config)
  electra_model.generator_config(config)


OBJECTIVE = Objective(
    name="electra", make_model=make_model, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    log_keys=(("loss", "loss"), ("gen_acc", "mlm_accuracy"),
              ("disc_acc", "disc_accuracy"), ("disc_prec", "disc_precision"),
              ("disc_rec", "disc_recall"), ("replaced", "replaced_share")),
    validate=validate, flops=flops)
