"""Fine-tuning a ModernBERT: sequence classification or regression.

The loss, metrics and features are ``objectives.classify``'s (cross-entropy,
or MSE for model.num_labels = 1); the model is
``ModernBertForSequenceClassification`` ([CLS] or mean pooling, the
prediction head, a classifier with bias), exported as Hugging Face's class
of that name (``hf/modernbert.py``).
"""

from __future__ import annotations

from bert_jax.models import flops as flops_lib
from bert_jax.models import modernbert as model_lib
from bert_jax.objectives import Objective
from bert_jax.objectives import classify
from bert_jax.objectives import modernbert


def make_model(config, rngs):
  return model_lib.ModernBertForSequenceClassification(config.model,
                                                       rngs=rngs)


def flops(config, work: flops_lib.Work) -> float:
  """ModernBERT's encoder on `work` (GeGLU, windowed local layers); the
  head and classifier run on one pooled vector per row (not counted, as in
  BERT's classify), and no MLM logits."""
  return flops_lib.modernbert_encoder_flops(config.model, work,
                                            config.data.seq_length)


def validate(config) -> None:
  """The model's own checks, then a task's (``classify.validate``)."""
  model_lib.validate_model_config(config.model)
  classify.validate(config)


OBJECTIVE = Objective(
    name="modernbert_classify", make_model=make_model,
    feature_spec=classify.feature_spec, loss_sums=classify.loss_sums,
    counts=classify.counts, loss=classify.loss, metrics=classify.metrics,
    log_keys=classify.OBJECTIVE.log_keys, predict=classify.predict,
    flops=flops,
    validate=validate,
    finetune_objectives=modernbert.FINETUNE_OBJECTIVES,
    finetune_params=modernbert.finetune_params)
