"""RoBERTa (Liu et al. 2019) and, by :func:`family`, XLM-R (Conneau et al.
2020): ``RobertaForMaskedLM`` / ``RobertaModel`` (``XLMRoberta...``) and,
through the task kinds, their sequence-classification, token-classification
and question-answering classes.

The encoder is BERT's (``models.bert.BertModel``) with positions counted
from the padding id (``model.positions_from_pad``: the first token's
position id is ``pad_token_id + 1``, as Hugging Face's
``create_position_ids_from_input_ids``) and one token type; the masked LM
(``models.roberta.RobertaForMaskedLM``) has no pooler and no sentence-pair
head, its LM head is BERT's under Hugging Face's names (``lm_head.dense``,
``lm_head.layer_norm``, ``lm_head.bias``; ``lm_head.decoder.weight`` is the
tied word embedding, written on export). The two families differ only in
``model_type`` and class names: XLM-R's ``XLMRoberta*`` classes keep the
``roberta.*`` parameter names.

Head layout (Hugging Face's): a sentence head is ``classifier.dense`` ->
tanh -> ``classifier.out_proj`` on ``<s>`` (here the pooler and the output,
with dropout before the output), a token head ``classifier``, the QA head
``qa_outputs``. ``pad_token_id`` is part of the architecture here (it moves
every position), so config.json's is the model config's, never the export
tokenizer's.
"""

from __future__ import annotations

from bert_jax.families import Family
from bert_jax.families import default_hf_models
from bert_jax.families import bert as bert_family
from bert_jax.hf.mapping import Row
from bert_jax.hf.mapping import Table
from bert_jax.models import bert as bert_model
from bert_jax.models import heads
from bert_jax.models import roberta as roberta_model
from bert_jax.objectives import roberta as roberta_objective

# RobertaConfig's defaults where config.json leaves a field out (its class
# defaults are BERT's but for these).
_DEFAULTS = dict(vocab_size=50265, pad_token_id=1)
# <s> and </s> in RoBERTa's and XLM-R's vocabularies (config.json's
# bos_token_id / eos_token_id; an export with a tokenizer writes its own).
_BOS, _EOS = 0, 2

_ENCODER_ROWS = tuple(
    Row("roberta." + r.ours[len("bert."):], "roberta." + r.hf[len("bert."):],
        "", r.transpose_hf, False)
    for r in bert_family.BERT.rows
    if r.ours.startswith(("bert.embeddings.", "bert.layers.")))
_LM_HEAD_ROWS = (
    Row("lm_head.transform.kernel", "lm_head.dense.weight", "", True, False),
    Row("lm_head.transform.bias", "lm_head.dense.bias", "", False, False),
    Row("lm_head.layer_norm.scale", "lm_head.layer_norm.weight", "", False, False),
    Row("lm_head.layer_norm.bias", "lm_head.layer_norm.bias", "", False, False),
    Row("lm_head.bias", "lm_head.bias", "", False, False),
)
_POOLER_ROWS = (
    Row("roberta.pooler.kernel", "classifier.dense.weight", "", True, False),
    Row("roberta.pooler.bias", "classifier.dense.bias", "", False, False),
)


def config_to_hf(mc, model_type: str, architecture: str) -> dict:
  """Our model config -> a RobertaConfig / XLMRobertaConfig dict."""
  cfg = bert_family.config_to_hf(mc, int(mc.pad_token_id), architecture)
  cfg.update(model_type=model_type, bos_token_id=_BOS, eos_token_id=_EOS)
  return cfg


def config_from_hf(hf_config) -> object:
  """A RobertaConfig / XLMRobertaConfig dict -> our model config (BERT's
  fields, the padding id, positions counted from it); ValueError for what
  is not implemented (another position embedding type or activation)."""
  hf_config = dict(_DEFAULTS, **{k: v for k, v in dict(hf_config).items()
                                 if v is not None})
  mc = bert_family.config_from_hf(hf_config)
  mc.update(pad_token_id=int(hf_config["pad_token_id"]),
            positions_from_pad=True)
  bert_model.validate_model_config(mc)
  return mc


def _masked_lm(model_config, rngs):
  return roberta_model.RobertaForMaskedLM(model_config, rngs=rngs)


def make_encoder(model_config, rngs, pooler: bool):
  """BERT's encoder; its pooler is the sentence head's classifier.dense."""
  return bert_model.BertModel(model_config, rngs=rngs,
                              add_pooling_layer=pooler)


LAYOUT = heads.HeadLayout(pooler_act="tanh")


def family(name: str, title: str, prefix: str, objective) -> Family:
  """The family of config.json model_type `name` whose Hugging Face classes
  are ``{prefix}ForMaskedLM``, ``{prefix}Model``, ...; pretrained by
  `objective`."""
  to_hf = lambda arch: (lambda mc, pad_token_id=None: config_to_hf(
      mc, name, arch))
  masked_lm = Table(
      name=name.replace("-", "_"), model_type=name, make_model=_masked_lm,
      config_to_hf=to_hf(f"{prefix}ForMaskedLM"),
      config_from_hf=config_from_hf,
      rows=_ENCODER_ROWS + _LM_HEAD_ROWS,
      tied={"lm_head.decoder.weight":
            "roberta.embeddings.word_embeddings.weight",
            "lm_head.decoder.bias": "lm_head.bias"},
      # {prefix}Model has no LM head (its pooler is skipped on import).
      heads={"lm_head": "lm_head"},
      architectures=(("lm_head.", f"{prefix}ForMaskedLM"),),
      default_architecture=f"{prefix}Model", base_prefix="roberta.",
      export_architecture=f"{prefix}ForMaskedLM", masked_lm=True,
      shape_fields={"lm_head.bias": "vocab_size"})
  encoder = bert_family.encoder_table(
      masked_lm, name=f"{masked_lm.name}_encoder",
      architecture=f"{prefix}Model", rows=_ENCODER_ROWS,
      config_to_hf=to_hf(f"{prefix}Model"), attr="roberta",
      make=make_encoder)
  return Family(
      name=name, title=title, objectives=(objective,),
      pretraining_tables=(masked_lm,), encoder_table=encoder,
      encoder_attr="roberta", make_encoder=make_encoder, head_layout=LAYOUT,
      pooler_rows=_POOLER_ROWS, transform_rows=(),
      output_hf={heads.POOLED: "classifier.out_proj"}, output_tf={},
      encoder_flops=bert_family.encoder_flops,
      validate_model=bert_model.validate_model_config,
      pretrained_encoder_config=lambda config: bert_family.encoder_config(
          config.model, LAYOUT.pooler_act),
      pretrained_encoder_params=lambda config, params: {
          "roberta": params["roberta"]},
      hf_models=default_hf_models)


FAMILY = family("roberta", "RoBERTa", "Roberta", roberta_objective.OBJECTIVE)
