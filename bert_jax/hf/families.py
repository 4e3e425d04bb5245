"""ALBERT and DistilBERT tables for the ``hf.mapping`` registry.

Each family is one ``mapping.register`` call: its rows (our path, HF name,
transposed?), tied copies, heads a source may lack, and its config.json
conversion. Export and import read the same rows (``mapping.to_hf_state_dict``
/ ``from_hf_state_dict``); ``checkpoint_io.save_hf_model(..., family=...)``
writes a loadable directory.

ALBERT: "{i}" is the shared group (HF ``albert_layer_groups.{i}``), one
inner layer per group (``inner_group_num=1``, every released ALBERT).
DistilBERT: our ``model.BertForMaskedLM`` with type_vocab_size 0.
"""

from __future__ import annotations

from bert_jax import config_lib
from bert_jax.hf import mapping
from bert_jax.hf.mapping import Row
from bert_jax.models import albert
from bert_jax.models import bert as model_lib


def _rows(pairs):
  return tuple(Row(ours, hf, "", t, False) for ours, hf, t in pairs)


# --------------------------------------------------------------------------
# ALBERT
# --------------------------------------------------------------------------
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


ALBERT = mapping.register(mapping.Family(
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
    shape_fields={"embeddings.": "embedding_size"},
    objectives=("albert",), masked_lm=True,
    sentence_heads=("albert.pooler", "sop_classifier"),
    blocks_field="num_hidden_groups",
    config_to_hf=_albert_to_hf, config_from_hf=_albert_from_hf,
))


# --------------------------------------------------------------------------
# DistilBERT
# --------------------------------------------------------------------------
def _distil_model(model_config, rngs):
  return model_lib.BertForMaskedLM(model_config, rngs=rngs)


# DistilBertConfig name -> ours.
_DISTIL_FIELDS = (("vocab_size", "vocab_size"),
                  ("max_position_embeddings", "max_position_embeddings"),
                  ("initializer_range", "initializer_range"),
                  ("dim", "hidden_size"), ("n_layers", "num_hidden_layers"),
                  ("n_heads", "num_attention_heads"),
                  ("hidden_dim", "intermediate_size"),
                  ("dropout", "hidden_dropout_prob"),
                  ("attention_dropout", "attention_probs_dropout_prob"),
                  ("activation", "hidden_act"))


def _distil_to_hf(mc, pad_token_id: int = 0) -> dict:
  if int(mc.type_vocab_size):
    raise ValueError(f"model.type_vocab_size={mc.type_vocab_size}: DistilBERT "
                     "has no segment embeddings (the student config sets 0).")
  cfg = {hf: mc[ours] for hf, ours in _DISTIL_FIELDS}
  cfg.update(architectures=["DistilBertForMaskedLM"], model_type="distilbert",
             pad_token_id=int(pad_token_id), tie_word_embeddings=True,
             sinusoidal_pos_embds=False)
  return cfg


def _distil_from_hf(hf_cfg):
  mc = config_lib.model_config("base")
  for hf, ours in _DISTIL_FIELDS:
    if hf in hf_cfg:
      mc[ours] = type(mc[ours])(hf_cfg[hf])
  mc.type_vocab_size = 0
  if hf_cfg.get("sinusoidal_pos_embds"):
    raise ValueError("sinusoidal_pos_embds=True DistilBERT checkpoints are not "
                     "supported (learned positions only).")
  return mc


_DL, _DH = "bert.layers.{i}.", "distilbert.transformer.layer.{i}."
DISTILBERT = mapping.register(mapping.Family(
    name="distilbert", model_type="distilbert", make_model=_distil_model,
    rows=_rows((
        ("bert.embeddings.word_embeddings", "distilbert.embeddings.word_embeddings.weight", False),
        ("bert.embeddings.position_embeddings", "distilbert.embeddings.position_embeddings.weight", False),
        ("bert.embeddings.layer_norm.scale", "distilbert.embeddings.LayerNorm.weight", False),
        ("bert.embeddings.layer_norm.bias", "distilbert.embeddings.LayerNorm.bias", False),
        (_DL + "attention.query.kernel", _DH + "attention.q_lin.weight", True),
        (_DL + "attention.query.bias", _DH + "attention.q_lin.bias", False),
        (_DL + "attention.key.kernel", _DH + "attention.k_lin.weight", True),
        (_DL + "attention.key.bias", _DH + "attention.k_lin.bias", False),
        (_DL + "attention.value.kernel", _DH + "attention.v_lin.weight", True),
        (_DL + "attention.value.bias", _DH + "attention.v_lin.bias", False),
        (_DL + "attention.output.kernel", _DH + "attention.out_lin.weight", True),
        (_DL + "attention.output.bias", _DH + "attention.out_lin.bias", False),
        (_DL + "attention.layer_norm.scale", _DH + "sa_layer_norm.weight", False),
        (_DL + "attention.layer_norm.bias", _DH + "sa_layer_norm.bias", False),
        (_DL + "feed_forward.intermediate.kernel", _DH + "ffn.lin1.weight", True),
        (_DL + "feed_forward.intermediate.bias", _DH + "ffn.lin1.bias", False),
        (_DL + "feed_forward.output.kernel", _DH + "ffn.lin2.weight", True),
        (_DL + "feed_forward.output.bias", _DH + "ffn.lin2.bias", False),
        (_DL + "feed_forward.layer_norm.scale", _DH + "output_layer_norm.weight", False),
        (_DL + "feed_forward.layer_norm.bias", _DH + "output_layer_norm.bias", False),
        ("mlm_head.transform.kernel", "vocab_transform.weight", True),
        ("mlm_head.transform.bias", "vocab_transform.bias", False),
        ("mlm_head.layer_norm.scale", "vocab_layer_norm.weight", False),
        ("mlm_head.layer_norm.bias", "vocab_layer_norm.bias", False),
        ("mlm_head.bias", "vocab_projector.bias", False),
    )),
    tied={"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"},
    heads={"mlm_head": "vocab_"},
    architectures=(("vocab_projector.", "DistilBertForMaskedLM"),),
    default_architecture="DistilBertModel", base_prefix="distilbert.",
    # The student of a distillation run (objectives/distil.py).
    objectives=("distil",), masked_lm=True,
    objective_fields=lambda mc: {"student_layers": int(mc.num_hidden_layers)},
    config_to_hf=_distil_to_hf, config_from_hf=_distil_from_hf,
))
