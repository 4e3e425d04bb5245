"""ALBERT (Lan et al. 2020): ``AlbertForPreTraining`` / ``AlbertForMaskedLM``
/ ``AlbertModel``, and through the task kinds ALBERT's task classes.

"{i}" in the table is the shared group (HF ``albert_layer_groups.{i}``), one
inner layer per group (``inner_group_num=1``, every released ALBERT). A
fine-tuned ALBERT unties its layers (each a copy of its group's block,
fine-tuned on its own: ``models.bert.BertModel`` with E != H), so its task
classes are exported with one group per layer (``num_hidden_groups =
num_hidden_layers``): the same function, each layer its own weights. A
released ALBERT task directory with shared groups reads as an ALBERT run
(:func:`_untied`): fine-tuning copies its groups into every layer.
"""

from __future__ import annotations

import ml_collections

from bert_jax import config_lib
from bert_jax.families import Family
from bert_jax.families import default_hf_models
from bert_jax.families import bert as bert_family
from bert_jax.hf.mapping import Row
from bert_jax.hf.mapping import Table
from bert_jax.models import albert
from bert_jax.models import heads
from bert_jax.models import bert as bert_model
from bert_jax.objectives import albert as albert_objective


def _rows(pairs):
  return tuple(Row(ours, hf, "", t, False) for ours, hf, t in pairs)


def _albert_model(model_config, rngs):
  return albert.AlbertForPreTraining(model_config, rngs=rngs)


_AL, _AH = "albert.groups.{i}.layers.0.", (
    "albert.encoder.albert_layer_groups.{i}.albert_layers.0.")
_ALBERT_FIELDS = ("vocab_size", "max_position_embeddings", "initializer_range",
                  "hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "type_vocab_size",
                  "layer_norm_eps", "embedding_size", "num_hidden_groups",
                  "inner_group_num", "classifier_dropout_prob")


def _albert_to_hf(mc, pad_token_id: int = 0) -> dict:
  if int(mc.embedding_size) in (0, int(mc.hidden_size)):
    raise ValueError(
        f"model.embedding_size={mc.embedding_size}: an ALBERT export needs "
        "factorized embeddings (0 < embedding_size != hidden_size, e.g. 128).")
  if int(mc.inner_group_num) != 1:
    raise ValueError(f"model.inner_group_num={mc.inner_group_num}: the ALBERT "
                     "table covers inner_group_num=1 (every released ALBERT).")
  cfg = {f: mc[f] for f in _ALBERT_FIELDS}
  cfg.update(architectures=["AlbertForPreTraining"], model_type="albert",
             pad_token_id=int(pad_token_id), tie_word_embeddings=True)
  return cfg


def _albert_from_hf(hf_cfg) -> object:
  mc = config_lib.model_config("base")
  for f in _ALBERT_FIELDS:
    if f in hf_cfg:
      mc[f] = type(mc[f])(hf_cfg[f])
  if mc.hidden_act not in ("gelu", "gelu_new"):
    raise ValueError(f"hidden_act={mc.hidden_act!r} is not supported "
                     "('gelu' or 'gelu_new').")
  return mc


ALBERT = Table(
    name="albert", model_type="albert", make_model=_albert_model,
    rows=_rows((
        ("albert.embeddings.word_embeddings", "albert.embeddings.word_embeddings.weight", False),
        ("albert.embeddings.position_embeddings", "albert.embeddings.position_embeddings.weight", False),
        ("albert.embeddings.token_type_embeddings", "albert.embeddings.token_type_embeddings.weight", False),
        ("albert.embeddings.layer_norm.scale", "albert.embeddings.LayerNorm.weight", False),
        ("albert.embeddings.layer_norm.bias", "albert.embeddings.LayerNorm.bias", False),
        ("albert.embeddings_project.kernel", "albert.encoder.embedding_hidden_mapping_in.weight", True),
        ("albert.embeddings_project.bias", "albert.encoder.embedding_hidden_mapping_in.bias", False),
        (_AL + "attention.query.kernel", _AH + "attention.query.weight", True),
        (_AL + "attention.query.bias", _AH + "attention.query.bias", False),
        (_AL + "attention.key.kernel", _AH + "attention.key.weight", True),
        (_AL + "attention.key.bias", _AH + "attention.key.bias", False),
        (_AL + "attention.value.kernel", _AH + "attention.value.weight", True),
        (_AL + "attention.value.bias", _AH + "attention.value.bias", False),
        (_AL + "attention.output.kernel", _AH + "attention.dense.weight", True),
        (_AL + "attention.output.bias", _AH + "attention.dense.bias", False),
        (_AL + "attention.layer_norm.scale", _AH + "attention.LayerNorm.weight", False),
        (_AL + "attention.layer_norm.bias", _AH + "attention.LayerNorm.bias", False),
        (_AL + "feed_forward.intermediate.kernel", _AH + "ffn.weight", True),
        (_AL + "feed_forward.intermediate.bias", _AH + "ffn.bias", False),
        (_AL + "feed_forward.output.kernel", _AH + "ffn_output.weight", True),
        (_AL + "feed_forward.output.bias", _AH + "ffn_output.bias", False),
        (_AL + "feed_forward.layer_norm.scale", _AH + "full_layer_layer_norm.weight", False),
        (_AL + "feed_forward.layer_norm.bias", _AH + "full_layer_layer_norm.bias", False),
        ("albert.pooler.kernel", "albert.pooler.weight", True),
        ("albert.pooler.bias", "albert.pooler.bias", False),
        ("mlm_head.transform.kernel", "predictions.dense.weight", True),
        ("mlm_head.transform.bias", "predictions.dense.bias", False),
        ("mlm_head.layer_norm.scale", "predictions.LayerNorm.weight", False),
        ("mlm_head.layer_norm.bias", "predictions.LayerNorm.bias", False),
        ("mlm_head.bias", "predictions.bias", False),
        ("sop_head.kernel", "sop_classifier.classifier.weight", True),
        ("sop_head.bias", "sop_classifier.classifier.bias", False),
    )),
    tied={"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
          "predictions.decoder.bias": "predictions.bias"},
    # AlbertModel has no heads, AlbertForMaskedLM no SOP head.
    heads={"albert.pooler": "albert.pooler", "mlm_head": "predictions",
           "sop_head": "sop_classifier"},
    architectures=(("sop_classifier.", "AlbertForPreTraining"),
                   ("predictions.", "AlbertForMaskedLM")),
    default_architecture="AlbertModel", base_prefix="albert.",
    export_architecture="AlbertForPreTraining",
    shape_fields={"embeddings.": "embedding_size"},
    masked_lm=True,
    sentence_heads=("albert.pooler", "sop_classifier"),
    blocks_field="num_hidden_groups",
    config_to_hf=_albert_to_hf, config_from_hf=_albert_from_hf,
)




def _encoder_rows() -> tuple[Row, ...]:
  """The fine-tuned (untied) encoder under ``bert.*``: each ALBERT group
  row as a layer row, the embeddings and their projection."""
  group = "albert.groups.{i}.layers.0."
  out = []
  for r in ALBERT.rows:
    if r.ours.startswith(group):
      ours = "bert.layers.{i}." + r.ours[len(group):]
    elif r.ours.startswith("albert.embeddings"):
      ours = "bert." + r.ours[len("albert."):]
    else:  # The pooler (a head's) and the MLM and SOP heads.
      continue
    out.append(Row(ours, r.hf, "", r.transpose_hf, False))
  return tuple(out)


def _untied_to_hf(mc, pad_token_id: int = 0) -> dict:
  """config.json of a fine-tuned ALBERT: one group per layer."""
  untied = ml_collections.ConfigDict(mc.to_dict())
  untied.num_hidden_groups = int(mc.num_hidden_layers)
  return dict(_albert_to_hf(untied, pad_token_id),
              architectures=["AlbertModel"])


def _untied(hf_cfg) -> bool:
  """One group per layer: a fine-tuned ALBERT as bert_jax exports it."""
  return hf_cfg.get("num_hidden_groups", 1) == hf_cfg.get(
      "num_hidden_layers", 12)


ENCODER = bert_family.encoder_table(
    ALBERT, name="albert_encoder", architecture="AlbertModel",
    rows=_encoder_rows(), config_to_hf=_untied_to_hf)


def pretrained_encoder_params(config, params) -> dict:
  """An ALBERT run's encoder for a task head: embeddings, the E -> H
  projection, the trained pooler, and each layer a copy of its group's
  block (the copies are fine-tuned untied)."""
  m = config.model
  if int(m.inner_group_num) != 1:
    raise ValueError(f"model.inner_group_num={m.inner_group_num}: fine-tuning "
                     "an ALBERT covers inner_group_num=1 (every released "
                     "ALBERT).")
  a, n, g = params["albert"], int(m.num_hidden_layers), int(
      m.num_hidden_groups)
  return {"bert": {
      "embeddings": a["embeddings"],
      "embeddings_project": a["embeddings_project"],
      "layers": {i: a["groups"][i * g // n]["layers"][0] for i in range(n)},
      "pooler": a["pooler"]}}


LAYOUT = heads.HeadLayout(pooler_act="tanh")

FAMILY = Family(
    name="albert", title="ALBERT", objectives=(albert_objective.OBJECTIVE,),
    pretraining_tables=(ALBERT,), encoder_table=ENCODER, encoder_attr="bert",
    make_encoder=bert_family.make_encoder, head_layout=LAYOUT,
    pooler_rows=(
        Row("bert.pooler.kernel", "albert.pooler.weight", "", True, False),
        Row("bert.pooler.bias", "albert.pooler.bias", "", False, False)),
    transform_rows=(), output_hf={},
    output_tf={}, encoder_flops=bert_family.encoder_flops,
    validate_model=bert_model.validate_model_config,
    pretrained_encoder_config=lambda config: bert_family.encoder_config(
        config.model, LAYOUT.pooler_act),
    pretrained_encoder_params=pretrained_encoder_params,
    hf_models=default_hf_models, reads_task_dir=_untied)
