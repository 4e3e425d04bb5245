"""ALBERT pretraining: masked LM plus sentence-order prediction.

The model is :class:`bert_jax.models.albert.AlbertForPreTraining` (factorized
embeddings, shared layers); the loss is BERT's (``objectives.bert``): MLM
sum / global masked count, plus the pair head's mean when ``data.nsp`` is
set. ALBERT configs set ``data.objective="sop"`` and ``data.max_ngram=3``.
"""

from __future__ import annotations

from bert_jax import config_lib
from bert_jax.data import checks as data_checks
from bert_jax.models import albert
from bert_jax.models import flops as flops_lib
from bert_jax.objectives import Objective
from bert_jax.objectives import bert


def published_config(layers: int, hidden: int, heads: int, ffn: int):
  """Lan et al. 2020's recipe at one size (configs/albert_*.py): E=128,
  vocab 30,000, all layers shared, gelu_new, no dropout (v2), SOP, n-gram
  masking of whole words, LAMB lr 0.00176 at batch 4096 for 125k steps."""
  config = config_lib.get_config("base")
  config.objective.name = "albert"
  config.model.update(
      vocab_size=30000, embedding_size=128, hidden_size=hidden,
      num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=ffn, hidden_act="gelu_new", hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0, num_hidden_groups=1,
      inner_group_num=1)
  config.data.update(objective="sop", nsp=True, max_ngram=3,
                     whole_word_mask=True, seq_length=512,
                     max_predictions_per_seq=20)
  config.train.update(optimizer="lamb", learning_rate=0.00176,
                      batch_size=4096, num_steps=125_000, warmup_steps=3125,
                      weight_decay=0.01, adam_eps=1e-6)
  return config


def make_model(config, rngs):
  return albert.AlbertForPreTraining(config.model, rngs=rngs)


def validate(config) -> None:
  if int(config.model.embedding_size) in (0, int(config.model.hidden_size)):
    raise ValueError(f"model.embedding_size={config.model.embedding_size} "
                     "with objective.name='albert': ALBERT factorizes its "
                     "embeddings; set 0 < embedding_size != hidden_size "
                     "(published: 128).")
  data_checks.check_pretraining(config)


OBJECTIVE = Objective(
    name="albert", make_model=make_model, feature_spec=bert.feature_spec,
    loss_sums=bert.loss_sums, counts=bert.counts, loss=bert.loss,
    metrics=bert.metrics,
    log_keys=(("loss", "loss"), ("mlm_acc", "mlm_accuracy"),
              ("sop_acc", "nsp_accuracy")),
    # Layer sharing saves parameters, not FLOPs; BERT's count with E != H
    # adds the projection and the H -> E MLM transform (the SOP head is
    # negligible).
    flops=flops_lib.bert_flops, validate=validate, packing=True)
