"""ALBERT pretraining: masked LM plus sentence-order prediction.

The model is :class:`bert_jax.albert.AlbertForPreTraining` (factorized
embeddings, shared layers); the loss is BERT's (``objectives.bert``): MLM
sum / global masked count, plus the pair head's mean when ``data.nsp`` is
set. ALBERT configs set ``data.objective="sop"`` and ``data.max_ngram=3``.
"""

from __future__ import annotations

from bert_jax import albert
from bert_jax.objectives import Objective
from bert_jax.objectives import bert


def make_model(config, rngs):
  return albert.AlbertForPreTraining(config.model, rngs=rngs)


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  del config
  outputs = bert.forward(model, batch, rng, deterministic)
  return {**bert.mlm_sums(outputs["mlm_logits"], batch),
          **bert.pair_sums(outputs["nsp_logits"],
                           batch["next_sentence_labels"])}


def hf_export(config):
  return "albert", config.model


OBJECTIVE = Objective(
    name="albert", make_model=make_model, feature_spec=bert.feature_spec,
    loss_sums=loss_sums, counts=bert.counts, loss=bert.loss,
    metrics=bert.metrics,
    log_keys=(("loss", "loss"), ("mlm_acc", "mlm_accuracy"),
              ("sop_acc", "nsp_accuracy")),
    hf_export=hf_export)
