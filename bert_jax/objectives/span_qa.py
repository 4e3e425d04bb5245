"""Fine-tuning: extractive QA, cross-entropy of the answer's start and end.

The loss of a window is (CE(start) + CE(end)) / 2 over its positions, as
google-research/bert's run_squad and Hugging Face's
``BertForQuestionAnswering``; a window without the answer (or an
unanswerable question) targets [CLS], position 0. Padding positions are
masked out of both softmaxes (a large negative logit), so a window's loss
does not depend on the bucket length it is padded to; rows of
``example_weights`` 0 (padding rows of the last eval batch) count nothing.
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

PADDING_LOGIT = -1e4  # Below any real logit, finite in every dtype.


def make_model(config, rngs):
  return model_lib.BertForQuestionAnswering(config.model, rngs=rngs)


def feature_spec(config):
  del config
  return features.SPAN_QA


def logits(model, batch, rng, deterministic: bool):
  """(start, end) logits [B, T] float32, padding positions masked."""
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  start, end = model(batch["input_ids"], batch["input_mask"],
                     batch["segment_ids"], deterministic=deterministic,
                     rngs=rngs)
  real = batch["input_mask"] > 0
  return (jnp.where(real, start, PADDING_LOGIT),
          jnp.where(real, end, PADDING_LOGIT))


def _nll(logits_, positions):
  return -jnp.take_along_axis(jax.nn.log_softmax(logits_),
                              positions[:, None], axis=-1)[:, 0]


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  del config
  start, end = logits(model, batch, rng, deterministic)
  w = batch["example_weights"]
  s, e = batch["start_positions"], batch["end_positions"]
  nll = 0.5 * (_nll(start, s) + _nll(end, e))
  hit = (jnp.argmax(start, -1) == s) & (jnp.argmax(end, -1) == e)
  return dict(loss=jnp.sum(w * nll), examples=jnp.sum(w),
              span_correct=jnp.sum(w * hit))


def predict(model, batch, config) -> dict:
  """Start and end logits [B, T] (padding masked), no dropout."""
  del config
  start, end = logits(model, batch, None, True)
  return dict(start_logits=start, end_logits=end)


def counts(batch, config) -> dict:
  del config
  return dict(examples=jnp.sum(batch["example_weights"]))


def loss(sums, counts_, config):
  del config
  return safe_div(sums["loss"], counts_["examples"])


def metrics(sums, counts_, config) -> dict:
  """Loss and the share of windows whose start and end argmax are right."""
  return dict(loss=loss(sums, counts_, config),
              span_accuracy=safe_div(sums["span_correct"],
                                     counts_["examples"]))


def flops(config, work: flops_lib.Work) -> float:
  """The encoder on `work` plus the start / end head on each of its tokens
  (6 d 2)."""
  return (flops_lib.encoder_flops(config.model, work)
          + work.tokens * 12.0 * config.model.hidden_size)


def validate(config) -> None:
  """A QA task's checks: the sequence shape, and room in it for the context
  beside the longest question (run_squad's max_seq_length >
  max_query_length + 3: [CLS] and two [SEP]); the answer search's sizes.
  The pretraining pipeline's checks do not apply (see classify)."""
  classify.check_task_run(config)
  task = config.get("task")
  if task is None:  # The objective alone (tests, tools): no windows to check.
    return
  seq, query = int(config.data.seq_length), int(task.max_query_length)
  if query < 1:
    raise ValueError(f"task.max_query_length={query} must be >= 1.")
  if seq <= query + 3:
    raise ValueError(f"data.seq_length={seq} must exceed task.max_query_length"
                     f"={query} + 3 ([CLS] and two [SEP]) to leave room for "
                     "the context.")
  for field in ("n_best_size", "max_answer_length"):
    if int(task[field]) < 1:
      raise ValueError(f"task.{field}={task[field]} must be >= 1.")
  if int(task.doc_stride) < 0:
    raise ValueError(f"task.doc_stride={task.doc_stride} must be >= 1, or 0 "
                     "(run_squad's 128).")


OBJECTIVE = Objective(
    name="span_qa", make_model=make_model, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    log_keys=(("loss", "loss"), ("span_acc", "span_accuracy")), flops=flops,
    predict=predict, validate=validate, hf_export=classify.hf_export)
