"""Fine-tuning: sequence classification (cross-entropy) or regression (MSE).

Rows with ``example_weights`` 0 pad the last eval batch of a bucket; they
carry no loss and no metric weight, so nothing is dropped or double-counted.
``model.num_labels`` = 1 selects regression (STS-B), as in Hugging Face.
Packed rows (``data.packing``) hold several examples each: the classifier
reads each example's [CLS] and labels / weights are [B, S], 0 in empty slots.
The evaluator scores every example from ``predict`` (the logits) and reports
the loss of ``loss_sums``, both from the trainer's predict step. The head is
the pooler on [CLS] (``model.pooler_act``: the activation of the encoder
family's own Hugging Face head) and a linear layer; the export is that
family's sequence-classification class (``hf.classify``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.data import checks as data_checks
from bert_jax.data import features
from bert_jax.hf import checkpoint_io
from bert_jax.hf import classify as hf_classify
from bert_jax.models import bert as model_lib
from bert_jax.objectives import Objective
from bert_jax.objectives import safe_div


def is_regression(config) -> bool:
  return config.model.num_labels == 1


def make_model(config, rngs):
  return model_lib.BertForSequenceClassification(config.model, rngs=rngs)


def feature_spec(config):
  return features.classification_spec(is_regression(config),
                                      bool(config.data.get("packing", False)))


def logits(model, batch, rng, deterministic: bool):
  """[B, num_labels], or [B, S, num_labels] for packed rows."""
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  return model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
               deterministic=deterministic, rngs=rngs,
               **features.packed_inputs(batch))


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  out = logits(model, batch, rng, deterministic)
  w = batch["example_weights"]
  if is_regression(config):
    err = out[..., 0] - batch["labels"].astype(jnp.float32)
    return dict(loss=jnp.sum(w * err * err), examples=jnp.sum(w),
                correct=jnp.zeros((), jnp.float32))
  labels = batch["labels"]
  nll = -jnp.take_along_axis(jax.nn.log_softmax(out), labels[..., None],
                             axis=-1)[..., 0]
  return dict(loss=jnp.sum(w * nll), examples=jnp.sum(w),
              correct=jnp.sum(w * (jnp.argmax(out, -1) == labels)))


def predict(model, batch, config) -> dict:
  """Per-example logits [B, num_labels] (regression: [B, 1]; packed rows
  [B, S, ...], one per slot), no dropout."""
  del config
  return dict(logits=logits(model, batch, None, True))


def counts(batch, config) -> dict:
  del config
  return dict(examples=jnp.sum(batch["example_weights"]))


def loss(sums, counts_, config):
  del config
  return safe_div(sums["loss"], counts_["examples"])


def metrics(sums, counts_, config) -> dict:
  out = dict(loss=loss(sums, counts_, config))
  if not is_regression(config):
    out["accuracy"] = safe_div(sums["correct"], counts_["examples"])
  return out


def check_task_run(config) -> None:
  """Every fine-tuning task's checks (sentence, token, span): one phase,
  and the sequence shape."""
  if config.train.phases or config.train.recipe:
    raise ValueError("train.phases / train.recipe apply to pretraining runs "
                     "only (a fine-tuning run's batches are its task's "
                     "length buckets, task.buckets); leave them empty.")
  data_checks.check_sequence(config)


def validate(config) -> None:
  """A task's checks: the sequence shape and the head. The pretraining
  pipeline's (tokenizer training, masking, sentence pairs) do not apply:
  rows come from the task with the checkpoint's tokenizer."""
  check_task_run(config)
  if int(config.model.num_labels) < 1:
    raise ValueError(f"model.num_labels={config.model.num_labels} must be >= 1"
                     " (1: regression).")


def hf_export(config, params) -> tuple[checkpoint_io.HFModel, ...]:
  """The fine-tuned head as the class of the family it was fine-tuned from
  (``objective.encoder``; ``hf.classify``): sequence classification here,
  token classification or QA for those objectives (the same hook)."""
  family = hf_classify.for_encoder(config.objective.encoder,
                                   config.objective.name)
  return (checkpoint_io.HFModel("", family.name, config.model, params),)


OBJECTIVE = Objective(
    name="classify", make_model=make_model, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    log_keys=(("loss", "loss"),), predict=predict, validate=validate,
    hf_export=hf_export, packing=True)
