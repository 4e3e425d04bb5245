"""BERT pretraining: masked LM plus an optional sentence-pair head.

The sentence-pair head is trained when ``data.nsp`` is set (NSP for BERT,
sentence order for ALBERT-style SOP data); RoBERTa-style packed batches
(``data.nsp=False``) train MLM alone. MLM logits are computed only at the
``max_predictions_per_seq`` masked positions.

Packed batches (``data.packing``) carry ``sequence_ids`` / ``position_ids``
(attention inside each packed example) and one pair label per packed pair
with its weight; the pair head reads each pair's own [CLS]
(``cls_positions``). The loss is the same sums over the same examples:
a packed batch gives the loss of its examples unpacked.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.data import checks as data_checks
from bert_jax.data import features
from bert_jax.models import bert
from bert_jax.models import flops as flops_lib
from bert_jax.objectives import Objective
from bert_jax.objectives import safe_div


def make_model(config, rngs):
  return bert.BertForPreTraining(config.model, rngs=rngs)


def feature_spec(config):
  return features.pretraining_spec(config.data)


def mlm_sums(mlm_logits, batch) -> dict:
  """Sums of the masked-LM loss and hits over the weighted masked positions."""
  logits = mlm_logits.astype(jnp.float32)
  ids, w = batch["masked_lm_ids"], batch["masked_lm_weights"]
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, ids[..., None], axis=-1)[..., 0]
  return dict(mlm_loss=jnp.sum(nll * w),
              mlm_correct=jnp.sum((jnp.argmax(logits, -1) == ids) * w),
              mlm_weight=jnp.sum(w))


def mlm_counts(batch, config) -> dict:
  """The global masked count of an objective trained on masked LM alone
  (RoBERTa, ModernBERT): no sentence-pair head to count."""
  del config
  return dict(mlm_weight=jnp.sum(batch["masked_lm_weights"]))


def mlm_loss(sums, counts_, config):
  """MLM sum / global masked count, the whole loss of a masked-LM-alone
  objective."""
  del config
  return safe_div(sums["mlm_loss"], counts_["mlm_weight"])


def mlm_metrics(sums, counts_, config) -> dict:
  """A masked-LM-alone objective's metrics: its loss is its MLM loss."""
  value = mlm_loss(sums, counts_, config)
  return dict(loss=value, mlm_loss=value,
              mlm_accuracy=safe_div(sums["mlm_correct"],
                                    counts_["mlm_weight"]))


def pair_weights(batch):
  """1 per sentence pair ([B], or [B,S] packed with 0 in empty slots)."""
  if "next_sentence_weights" in batch:
    return batch["next_sentence_weights"].astype(jnp.float32)
  return jnp.ones(batch["next_sentence_labels"].shape, jnp.float32)


def pair_sums(nsp_logits, labels, weights=None) -> dict:
  """Sums of the sentence-pair (NSP / SOP) loss and hits over weighted
  pairs: logits [..., 2], labels and weights [...] ([B] or packed [B,S])."""
  logits = nsp_logits.astype(jnp.float32)
  w = (jnp.ones(labels.shape, jnp.float32) if weights is None else weights)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None],
                             axis=-1)[..., 0]
  hits = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  return dict(nsp_loss=jnp.sum(nll * w), nsp_correct=jnp.sum(hits * w),
              nsp_count=jnp.sum(w))


def forward(model, batch, rng, deterministic: bool):
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  return model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
               batch["masked_lm_positions"], deterministic=deterministic,
               rngs=rngs, **features.packed_inputs(batch))


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  del config
  outputs = forward(model, batch, rng, deterministic)
  return {**mlm_sums(outputs["mlm_logits"], batch),
          **pair_sums(outputs["nsp_logits"], batch["next_sentence_labels"],
                      pair_weights(batch))}


def counts(batch, config) -> dict:
  del config
  return dict(mlm_weight=jnp.sum(batch["masked_lm_weights"]),
              nsp_count=jnp.sum(pair_weights(batch)))


def loss(sums, counts_, config):
  """MLM sum / global masked count (+ the pair head's mean when trained)."""
  value = safe_div(sums["mlm_loss"], counts_["mlm_weight"])
  if config.data.nsp:
    value = value + safe_div(sums["nsp_loss"], counts_["nsp_count"])
  return value


def metrics(sums, counts_, config) -> dict:
  return dict(
      loss=loss(sums, counts_, config),
      mlm_loss=safe_div(sums["mlm_loss"], counts_["mlm_weight"]),
      mlm_accuracy=safe_div(sums["mlm_correct"], counts_["mlm_weight"]),
      nsp_loss=safe_div(sums["nsp_loss"], counts_["nsp_count"]),
      nsp_accuracy=safe_div(sums["nsp_correct"], counts_["nsp_count"]))


OBJECTIVE = Objective(
    name="bert", make_model=make_model, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    log_keys=(("loss", "loss"), ("mlm_acc", "mlm_accuracy"),
              ("nsp_acc", "nsp_accuracy")),
    flops=flops_lib.bert_flops, validate=data_checks.check_pretraining,
    packing=True)
