"""DistilBERT (Sanh et al. 2019): the student of a distillation run
(``objectives/distil.py``) as ``DistilBertForMaskedLM`` / ``DistilBertModel``,
and through the task kinds DistilBERT's task classes.

The student is ``models.bert.BertForMaskedLM`` with no segment table
(``type_vocab_size`` 0); a fine-tuned student is ``models.bert.BertModel``
whose pooler is the dense + ReLU Hugging Face's sequence classifier puts on
[CLS] (``pre_classifier``). A Hugging Face DistilBERT directory imports as
a distillation run whose student it is (``objective.student_layers`` its
layers).
"""

from __future__ import annotations

from bert_jax import config_lib
from bert_jax.families import Family
from bert_jax.families import bert as bert_family
from bert_jax.hf import checkpoint_io
from bert_jax.hf.mapping import Row
from bert_jax.hf.mapping import Table
from bert_jax.models import bert as bert_model
from bert_jax.models import heads
from bert_jax.objectives import distil


def _rows(pairs):
  return tuple(Row(ours, hf, "", t, False) for ours, hf, t in pairs)


def _distil_model(model_config, rngs):
  return bert_model.BertForMaskedLM(model_config, rngs=rngs)


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
DISTILBERT = Table(
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
    export_architecture="DistilBertForMaskedLM", masked_lm=True,
    config_to_hf=_distil_to_hf, config_from_hf=_distil_from_hf,
)


def _encoder_to_hf(mc, pad_token_id: int = 0) -> dict:
  """DistilBertModel's config.json (the sequence classifier's dropout is
  the model's)."""
  return dict(_distil_to_hf(mc, pad_token_id),
              architectures=["DistilBertModel"],
              seq_classif_dropout=float(mc.hidden_dropout_prob))


ENCODER = bert_family.encoder_table(
    DISTILBERT, name="distilbert_encoder", architecture="DistilBertModel",
    rows=[r for r in DISTILBERT.rows if r.ours.startswith("bert.")],
    config_to_hf=_encoder_to_hf)

LAYOUT = heads.HeadLayout(pooler_act="relu")


def hf_models(config, params) -> tuple:
  """A distillation run exports its student as DistilBertForMaskedLM."""
  return (checkpoint_io.HFModel("", DISTILBERT, distil.student_config(config),
                                params),)


def run_fields(model_config) -> dict:
  """The objective fields of a run whose student `model_config` is (an
  imported DistilBERT directory)."""
  return {"student_layers": int(model_config.num_hidden_layers)}


FAMILY = Family(
    name="distilbert", title="DistilBERT", objectives=(distil.OBJECTIVE,),
    pretraining_tables=(DISTILBERT,), encoder_table=ENCODER,
    encoder_attr="bert", make_encoder=bert_family.make_encoder,
    head_layout=LAYOUT, pooler_rows=(
        Row("bert.pooler.kernel", "pre_classifier.weight", "", True, False),
        Row("bert.pooler.bias", "pre_classifier.bias", "", False, False)),
    transform_rows=(),
    output_hf={}, output_tf={}, encoder_flops=bert_family.encoder_flops,
    validate_model=bert_model.validate_model_config,
    # The student, its pooler fresh.
    pretrained_encoder_config=lambda config: bert_family.encoder_config(
        distil.student_config(config), LAYOUT.pooler_act),
    pretrained_encoder_params=lambda config, params: {"bert": params["bert"]},
    hf_models=hf_models, hf_run_fields=run_fields)
