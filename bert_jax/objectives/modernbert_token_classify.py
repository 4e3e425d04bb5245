"""Fine-tuning a ModernBERT: token tagging (NER).

The loss, metrics, predict, features and checks are
``objectives.token_classify``'s (cross-entropy over the labelled
positions); the model is ``ModernBertForTokenClassification`` (the
prediction head and a classifier with bias at every position), exported as
Hugging Face's class of that name (``hf/modernbert.py``). It starts from a
ModernBERT run's encoder and prediction head (``modernbert.finetune_params``).
"""

from __future__ import annotations

from bert_jax.models import flops as flops_lib
from bert_jax.models import modernbert as model_lib
from bert_jax.objectives import modernbert
from bert_jax.objectives import token_classify


def make_model(config, rngs):
  return model_lib.ModernBertForTokenClassification(config.model, rngs=rngs)


def validate(config) -> None:
  """The model's own checks, then a tagging task's."""
  model_lib.validate_model_config(config.model)
  token_classify.validate(config)


def flops(config, work: flops_lib.Work) -> float:
  return modernbert.per_token_flops(config, work, config.model.num_labels)


OBJECTIVE = modernbert.head_objective(
    token_classify.OBJECTIVE, name="modernbert_token_classify", make_model=make_model,
    validate=validate, flops=flops)
