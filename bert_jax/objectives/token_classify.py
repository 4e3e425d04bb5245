"""Fine-tuning: token tagging (NER), cross-entropy per labelled position.

``label_weights`` is 1 at the positions whose tag is learned (a word's
first sub-token in the window that owns it; every sub-token with
``task.label_all_subtokens``) and 0 elsewhere ([CLS], [SEP], padding, later
sub-tokens, padding rows), so the loss is the mean over labelled words of the
whole global batch, whatever the mesh or bucket length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.data import features
from bert_jax.models import bert as model_lib
from bert_jax.models import flops as flops_lib
from bert_jax.objectives import Objective
from bert_jax.objectives import classify
from bert_jax.objectives import safe_div


def make_model(config, rngs):
  return model_lib.BertForTokenClassification(config.model, rngs=rngs)


def feature_spec(config):
  del config
  return features.TOKEN_CLASSIFICATION


def logits(model, batch, rng, deterministic: bool):
  """[B, T, num_labels] float32."""
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  return model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
               deterministic=deterministic, rngs=rngs)


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  del config
  out = logits(model, batch, rng, deterministic)
  labels, w = batch["labels"], batch["label_weights"]
  nll = -jnp.take_along_axis(jax.nn.log_softmax(out), labels[..., None],
                             axis=-1)[..., 0]
  return dict(loss=jnp.sum(w * nll), tokens=jnp.sum(w),
              correct=jnp.sum(w * (jnp.argmax(out, -1) == labels)))


def predict(model, batch, config) -> dict:
  """Per-position tag logits [B, T, num_labels], no dropout."""
  del config
  return dict(logits=logits(model, batch, None, True))


def counts(batch, config) -> dict:
  del config
  return dict(tokens=jnp.sum(batch["label_weights"]))


def loss(sums, counts_, config):
  del config
  return safe_div(sums["loss"], counts_["tokens"])


def metrics(sums, counts_, config) -> dict:
  return dict(loss=loss(sums, counts_, config),
              accuracy=safe_div(sums["correct"], counts_["tokens"]))


def flops(config, work: flops_lib.Work) -> float:
  """The encoder on `work` plus the tagging head on each of its tokens
  (6 d labels)."""
  m = config.model
  return (flops_lib.encoder_flops(m, work)
          + work.tokens * 6.0 * m.hidden_size * m.num_labels)


def validate(config) -> None:
  """A tagging task's checks: the sequence shape, the head and the windows
  over long sentences. The pretraining pipeline's (tokenizer training,
  masking, sentence pairs) do not apply: rows come from the task with the
  checkpoint's tokenizer."""
  classify.check_task_run(config)
  if int(config.model.num_labels) < 1:
    raise ValueError(f"model.num_labels={config.model.num_labels} must be >= 1"
                     " (the tag set's size).")
  task = config.get("task")
  if task is None:  # The objective alone (tests, tools): no windows to check.
    return
  window = int(config.data.seq_length) - 2  # [CLS] ... [SEP]
  if not 0 <= int(task.doc_stride) <= window:
    raise ValueError(f"task.doc_stride={task.doc_stride} must be between 1 and "
                     f"the window's {window} tokens (data.seq_length - 2), or "
                     "0 (half the window).")


OBJECTIVE = Objective(
    name="token_classify", make_model=make_model, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    log_keys=(("loss", "loss"), ("acc", "accuracy")), flops=flops,
    predict=predict, validate=validate, hf_export=classify.hf_export)
