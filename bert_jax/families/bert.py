"""BERT (Devlin et al. 2019): ``BertForPreTraining`` / ``BertForMaskedLM`` /
``BertModel`` and, through the task kinds, BERT's sequence-classification,
token-classification and question-answering classes.

The table (``BERT``) names every parameter of ``models.bert
.BertForPreTraining`` as Hugging Face and Google's TF checkpoints do; the
encoder's rows (``bert.*``) are the ones every BERT-architecture family
(ALBERT fine-tuned, ELECTRA, DistilBERT) renames. The head layout is
Hugging Face's: the pooler (dense + tanh on [CLS]) before a sentence head,
dropout before the sentence and token heads, none before ``qa_outputs``;
google-research/bert names the heads ``output_weights`` / ``output_bias``
(``run_classifier.py``) and ``cls/squad/output_*`` (``run_squad.py``).
"""

from __future__ import annotations

from bert_jax import config_lib
from bert_jax.families import Family
from bert_jax.families import default_hf_models
from bert_jax.hf.mapping import Row
from bert_jax.hf.mapping import Table
from bert_jax.models import bert as bert_model
from bert_jax.models import flops as flops_lib
from bert_jax.models import heads
from bert_jax.objectives import bert as bert_objective

# HF BertConfig fields that our model config shares, by the same name.
MODEL_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "hidden_act",
                "hidden_dropout_prob", "attention_probs_dropout_prob",
                "max_position_embeddings", "type_vocab_size",
                "initializer_range", "layer_norm_eps")
_INTS = ("vocab_size", "hidden_size", "num_hidden_layers",
         "num_attention_heads", "intermediate_size", "max_position_embeddings",
         "type_vocab_size")


def config_to_hf(mc, pad_token_id: int = 0,
                 architecture: str = "BertForPreTraining") -> dict:
  """Our model config -> a BertConfig dict (config.json)."""
  cfg = {"architectures": [architecture], "model_type": "bert"}
  for f in MODEL_FIELDS:
    v = mc[f]
    cfg[f] = v if isinstance(v, str) else int(v) if f in _INTS else float(v)
  cfg.update(pad_token_id=int(pad_token_id),
             position_embedding_type="absolute", tie_word_embeddings=True,
             dtype="float32")
  return cfg


def config_from_hf(hf_config) -> object:
  """A BertConfig dict (or Google's bert_config.json) -> our model config;
  ValueError for what BERT here does not implement."""
  cfg = config_lib.model_config("base")
  for f in MODEL_FIELDS:
    if f in hf_config:
      cfg[f] = type(cfg[f])(hf_config[f])
  if "intermediate_size" not in hf_config:
    cfg.intermediate_size = 4 * cfg.hidden_size
  labels = hf_config.get("num_labels") or len(hf_config.get("id2label") or {})
  if labels:
    cfg.num_labels = int(labels)
  if "num_attention_heads" not in hf_config:
    cfg.num_attention_heads = cfg.hidden_size // 64
  pos = hf_config.get("position_embedding_type", "absolute")
  if pos != "absolute":
    raise ValueError(f"position_embedding_type={pos!r} is not supported "
                     "(only 'absolute').")
  if cfg.hidden_act != "gelu":
    raise ValueError(f"hidden_act={cfg.hidden_act!r} is not supported; this "
                     "model implements exact (erf) 'gelu' only.")
  return cfg


def _pretraining_model(model_config, rngs):
  return bert_model.BertForPreTraining(model_config, rngs=rngs)


_L = "bert.layers.{i}."
_HL = "bert.encoder.layer.{i}."
_TL = "bert/encoder/layer_{i}/"

BERT = Table(
    name="bert", model_type="bert", make_model=_pretraining_model,
    config_to_hf=config_to_hf, config_from_hf=config_from_hf,
    rows=(
        Row("bert.embeddings.word_embeddings", "bert.embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings", False, False),
        Row("bert.embeddings.position_embeddings", "bert.embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings", False, False),
        Row("bert.embeddings.token_type_embeddings", "bert.embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings", False, False),
        Row("bert.embeddings.layer_norm.scale", "bert.embeddings.LayerNorm.weight", "bert/embeddings/LayerNorm/gamma", False, False),
        Row("bert.embeddings.layer_norm.bias", "bert.embeddings.LayerNorm.bias", "bert/embeddings/LayerNorm/beta", False, False),
        Row(_L + "attention.query.kernel", _HL + "attention.self.query.weight", _TL + "attention/self/query/kernel", True, False),
        Row(_L + "attention.query.bias", _HL + "attention.self.query.bias", _TL + "attention/self/query/bias", False, False),
        Row(_L + "attention.key.kernel", _HL + "attention.self.key.weight", _TL + "attention/self/key/kernel", True, False),
        Row(_L + "attention.key.bias", _HL + "attention.self.key.bias", _TL + "attention/self/key/bias", False, False),
        Row(_L + "attention.value.kernel", _HL + "attention.self.value.weight", _TL + "attention/self/value/kernel", True, False),
        Row(_L + "attention.value.bias", _HL + "attention.self.value.bias", _TL + "attention/self/value/bias", False, False),
        Row(_L + "attention.output.kernel", _HL + "attention.output.dense.weight", _TL + "attention/output/dense/kernel", True, False),
        Row(_L + "attention.output.bias", _HL + "attention.output.dense.bias", _TL + "attention/output/dense/bias", False, False),
        Row(_L + "attention.layer_norm.scale", _HL + "attention.output.LayerNorm.weight", _TL + "attention/output/LayerNorm/gamma", False, False),
        Row(_L + "attention.layer_norm.bias", _HL + "attention.output.LayerNorm.bias", _TL + "attention/output/LayerNorm/beta", False, False),
        Row(_L + "feed_forward.intermediate.kernel", _HL + "intermediate.dense.weight", _TL + "intermediate/dense/kernel", True, False),
        Row(_L + "feed_forward.intermediate.bias", _HL + "intermediate.dense.bias", _TL + "intermediate/dense/bias", False, False),
        Row(_L + "feed_forward.output.kernel", _HL + "output.dense.weight", _TL + "output/dense/kernel", True, False),
        Row(_L + "feed_forward.output.bias", _HL + "output.dense.bias", _TL + "output/dense/bias", False, False),
        Row(_L + "feed_forward.layer_norm.scale", _HL + "output.LayerNorm.weight", _TL + "output/LayerNorm/gamma", False, False),
        Row(_L + "feed_forward.layer_norm.bias", _HL + "output.LayerNorm.bias", _TL + "output/LayerNorm/beta", False, False),
        Row("bert.pooler.kernel", "bert.pooler.dense.weight", "bert/pooler/dense/kernel", True, False),
        Row("bert.pooler.bias", "bert.pooler.dense.bias", "bert/pooler/dense/bias", False, False),
        Row("mlm_head.transform.kernel", "cls.predictions.transform.dense.weight", "cls/predictions/transform/dense/kernel", True, False),
        Row("mlm_head.transform.bias", "cls.predictions.transform.dense.bias", "cls/predictions/transform/dense/bias", False, False),
        Row("mlm_head.layer_norm.scale", "cls.predictions.transform.LayerNorm.weight", "cls/predictions/transform/LayerNorm/gamma", False, False),
        Row("mlm_head.layer_norm.bias", "cls.predictions.transform.LayerNorm.bias", "cls/predictions/transform/LayerNorm/beta", False, False),
        Row("mlm_head.bias", "cls.predictions.bias", "cls/predictions/output_bias", False, False),
        # Google stores output_weights (2, hidden), like HF.
        Row("nsp_head.kernel", "cls.seq_relationship.weight", "cls/seq_relationship/output_weights", True, True),
        Row("nsp_head.bias", "cls.seq_relationship.bias", "cls/seq_relationship/output_bias", False, False),
    ),
    # The MLM decoder is tied to the word embeddings; its bias is
    # cls.predictions.bias.
    tied={"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"},
    # BertModel has no cls.*, BertForMaskedLM no pooler/NSP.
    heads={"bert.pooler": "bert.pooler", "mlm_head": "cls.predictions",
           "nsp_head": "cls.seq_relationship"},
    architectures=(("cls.seq_relationship.", "BertForPreTraining"),
                   ("cls.predictions.", "BertForMaskedLM")),
    default_architecture="BertModel",
    base_prefix="bert.",
    export_architecture="BertForPreTraining",
    masked_lm=True,
    sentence_heads=("bert.pooler", "cls.seq_relationship"),
)


def make_encoder(model_config, rngs, pooler: bool):
  """BERT's encoder (``models.bert.BertModel``), with the pooler when a
  sentence head reads it."""
  return bert_model.BertModel(model_config, rngs=rngs,
                             add_pooling_layer=pooler)


def encoder_table(table: Table, *, name: str, architecture: str, rows,
                  config_to_hf, config_from_hf=None, attr: str = "bert",
                  make=make_encoder, **fields) -> Table:
  """A family's bare-encoder table (``{Prefix}Model``): `rows` (the encoder
  under `attr`, built by `make`, no pooler) and config.json written as
  `architecture`; the config reader (unless given), base prefix, shape
  fields and optional rows are `table`'s; `fields` adds others
  (first_layer)."""
  return Table(
      name=name, model_type=table.model_type, rows=tuple(rows),
      make_model=lambda mc, rngs: heads.EncoderModel(
          mc, encoder_attr=attr, make_encoder=make, rngs=rngs),
      config_to_hf=config_to_hf,
      config_from_hf=config_from_hf or table.config_from_hf,
      default_architecture=architecture, export_architecture=architecture,
      base_prefix=table.base_prefix, shape_fields=table.shape_fields,
      optional=table.optional, **fields)


ENCODER = encoder_table(
    BERT, name="bert_encoder", architecture="BertModel",
    rows=[r for r in BERT.rows if r.ours.startswith("bert.")
          and not r.ours.startswith("bert.pooler.")],
    config_to_hf=lambda mc, pad_token_id=0: config_to_hf(
        mc, pad_token_id, "BertModel"))


def encoder_flops(model_config, work, seq_length: int) -> float:
  del seq_length  # Attention counts the work's query-key pairs.
  return flops_lib.encoder_flops(model_config, work)


def encoder_config(model_config, pooler_act: str):
  """The encoder's model config for a task head: `model_config` with the
  family's pooler activation."""
  mc = model_config.copy_and_resolve_references()
  mc.pooler_act = pooler_act
  return mc


LAYOUT = heads.HeadLayout(pooler_act="tanh")

FAMILY = Family(
    name="bert", title="BERT", objectives=(bert_objective.OBJECTIVE,),
    pretraining_tables=(BERT,), encoder_table=ENCODER, encoder_attr="bert",
    make_encoder=make_encoder, head_layout=LAYOUT,
    pooler_rows=tuple(r for r in BERT.rows if r.ours.startswith(
        "bert.pooler.")),
    transform_rows=(), output_hf={},
    output_tf={heads.POOLED: ("output_weights", "output_bias"),
               heads.TOKEN: ("output_weights", "output_bias"),
               heads.SPAN: ("cls/squad/output_weights",
                            "cls/squad/output_bias")},
    encoder_flops=encoder_flops,
    validate_model=bert_model.validate_model_config,
    pretrained_encoder_config=lambda config: encoder_config(
        config.model, LAYOUT.pooler_act),
    pretrained_encoder_params=lambda config, params: {"bert": params["bert"]},
    hf_models=default_hf_models)
