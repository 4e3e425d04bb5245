"""Fine-tuning a ModernBERT: extractive QA (answer start and end).

The loss, metrics, predict (padding masked out of both softmaxes),
features and checks are ``objectives.span_qa``'s; the model is
``ModernBertForQuestionAnswering`` (the prediction head and a 2-output
classifier with bias at every position, split into start and end),
exported as Hugging Face's class of that name (``hf/modernbert.py``). It
starts from a ModernBERT run's encoder and prediction head
(``modernbert.finetune_params``).
"""

from __future__ import annotations

from bert_jax.models import flops as flops_lib
from bert_jax.models import modernbert as model_lib
from bert_jax.objectives import modernbert
from bert_jax.objectives import span_qa


def make_model(config, rngs):
  return model_lib.ModernBertForQuestionAnswering(config.model, rngs=rngs)


def validate(config) -> None:
  """The model's own checks, then a QA task's."""
  model_lib.validate_model_config(config.model)
  span_qa.validate(config)


def flops(config, work: flops_lib.Work) -> float:
  return modernbert.per_token_flops(config, work, 2)


OBJECTIVE = modernbert.head_objective(
    span_qa.OBJECTIVE, name="modernbert_span_qa", make_model=make_model,
    validate=validate, flops=flops)
