"""BERT's Hugging Face table: ``bert`` (BertForPreTraining / MaskedLM /
BertModel). Listed in ``mapping.TABLE_MODULES``, read both ways by
``mapping``; its sequence-classification table is in ``hf.classify``.
"""

from __future__ import annotations

from bert_jax.hf import mapping
from bert_jax.hf.mapping import Family
from bert_jax.hf.mapping import Row
from bert_jax.models import bert as model_lib


# --------------------------------------------------------------------------
def _bert_model(model_config, rngs):
  return model_lib.BertForPreTraining(model_config, rngs=rngs)


_L = "bert.layers.{i}."
_HL = "bert.encoder.layer.{i}."
_TL = "bert/encoder/layer_{i}/"

BERT = mapping.register(Family(
    name="bert", model_type="bert", make_model=_bert_model,
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
    objectives=("bert",),
    masked_lm=True,
    sentence_heads=("bert.pooler", "cls.seq_relationship"),
))
