"""RoBERTa pretraining (Liu et al. 2019): masked LM alone on full sentences.

RoBERTa drops next-sentence prediction and trains on packed full sentences
(``data.nsp=False``: rows of consecutive sentences up to ``seq_length``,
across document ends with a separator; ``data.packing`` keeps documents
apart instead), masked dynamically (a new mask each time a row is read:
the pipeline masks every batch in graph). The model is
``models.roberta.RobertaForMaskedLM``; the loss is BERT's MLM sum over the
gathered masked positions / their global count (``objectives.bert
.mlm_sums``). XLM-R trains the same way on its own family
(``families/roberta.py`` declares both objectives, "roberta" and
"xlm-roberta").
"""

from __future__ import annotations

import dataclasses

from bert_jax import config_lib
from bert_jax.data import checks as data_checks
from bert_jax.models import bert as bert_model
from bert_jax.models import flops as flops_lib
from bert_jax.models import roberta
from bert_jax.objectives import Objective
from bert_jax.objectives import bert
from bert_jax.objectives import check_packed_input


# Hugging Face RobertaConfig / XLMRobertaConfig of the released models.
SIZES = {"base": dict(hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072),
         "large": dict(hidden_size=1024, num_hidden_layers=24,
                       num_attention_heads=16, intermediate_size=4096)}
VOCAB_SIZES = {"roberta": 50265, "xlm-roberta": 250002}
PAD_ID = 1  # <pad> in RoBERTa's and XLM-R's vocabularies.


def published_config(size: str, family: str = "roberta"):
  """RoBERTa's recipe (Liu et al. 2019, Table 9) at one size, on the
  architecture of `family`'s released models: 512 tokens (positions 2..513
  of a 514-row table), one token type, full sentences with no NSP, 15%
  dynamic masking, Adam betas 0.9 / 0.98, eps 1e-6, weight decay 0.01,
  8k sequences a step, 500k steps."""
  config = config_lib.get_config("base")
  config.objective.name = family
  config.model.update(
      vocab_size=VOCAB_SIZES[family], type_vocab_size=1,
      max_position_embeddings=514, pad_token_id=PAD_ID,
      positions_from_pad=True, layer_norm_eps=1e-5, hidden_act="gelu",
      hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
      **SIZES[size])
  # Its tokenizer: init_from's (continued pretraining), or a byte-level BPE
  # with RoBERTa's special tokens trained on the corpus (<pad> = 1).
  config.data.update(seq_length=512, max_predictions_per_seq=80,
                     mask_rate=0.15, nsp=False, objective="packed",
                     tokenizer_type="hf_json",
                     tokenizer_vocab_size=VOCAB_SIZES[family])
  config.train.update(
      num_steps=500_000, batch_size=8192,
      learning_rate=6e-4 if size == "base" else 4e-4,
      warmup_steps=24_000 if size == "base" else 30_000,
      adam_b1=0.9, adam_b2=0.98, adam_eps=1e-6, weight_decay=0.01)
  config.checkpoint.save_every_steps = 1000
  return config


def make_model(config, rngs):
  return roberta.RobertaForMaskedLM(config.model, rngs=rngs)


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  """Packed rows (data.packing) add their sequence and position ids: each
  document attends only to itself, its positions restart after the
  padding id. The model takes BERT's inputs, so BERT's forward call."""
  del config
  out = bert.forward(model, batch, rng, deterministic)
  return bert.mlm_sums(out["mlm_logits"], batch)


def validator(title: str):
  """The checks of a run of family `title`: the model's, no sentence-pair
  batches (the cause first), the pretraining pipeline's."""

  def validate(config) -> None:
    bert_model.validate_model_config(config.model)
    bert_model.check_unfactorized(config.model)
    check_packed_input(config, title)
    data_checks.check_pretraining(config)

  return validate


OBJECTIVE = Objective(
    name="roberta", make_model=make_model, feature_spec=bert.feature_spec,
    loss_sums=loss_sums, counts=bert.mlm_counts, loss=bert.mlm_loss,
    metrics=bert.mlm_metrics,
    log_keys=(("loss", "loss"), ("mlm_acc", "mlm_accuracy")),
    flops=flops_lib.bert_flops, validate=validator("RoBERTa"), packing=True)
# XLM-R: the same objective under its family's name.
XLM_OBJECTIVE = dataclasses.replace(OBJECTIVE, name="xlm-roberta",
                                    validate=validator("XLM-R"))
