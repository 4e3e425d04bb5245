"""ModernBERT (Warner et al. 2024): ``ModernBertForMaskedLM`` (a
``ModernBertModel`` directory imports with a fresh head), the config.json
conversion both ways, and the head layout of its task classes: the
prediction head (``head``: dense, activation, norm) between the pooled
vector or every token and ``classifier`` (the question-answering head too),
with ``classifier_dropout``. From a masked-LM directory or run a task head
takes the encoder and the prediction head (as Hugging Face does) and its
classifier is fresh.

Our tree mirrors HF's module names in snake case (``attn.Wqkv`` ->
``attn.wqkv``). Two kernels are fused in HF and stored with their parts on
an axis of their own here (so that a "heads" / "mlp" split shards each
part): Wqkv [in, 3, out] and GeGLU's Wi [in, 2, f] (``mapping.split_linear``).
The decoder weight is the token embedding (tied, written on export); its
bias is ours (``decoder.bias``). Block 0 has no ``attn_norm``, as in HF.
"""

from __future__ import annotations

from bert_jax import config_lib
from bert_jax.families import Family
from bert_jax.families import default_hf_models
from bert_jax.families import bert as bert_family
from bert_jax.hf import mapping
from bert_jax.hf.mapping import Table
from bert_jax.models import flops as flops_lib
from bert_jax.models import heads
from bert_jax.models import layers
from bert_jax.models import modernbert as modernbert_model
from bert_jax.models import rope_attention
from bert_jax.objectives import modernbert as modernbert_objective

_L, _HL = "model.layers.{i}.", "model.layers.{i}."
_FUSED3, _FUSED2 = mapping.split_linear(3), mapping.split_linear(2)
# Fixed by our implementation; a source that sets them otherwise is another
# function of its weights and is refused.
_FIXED = dict(norm_bias=False, attention_bias=False, mlp_bias=False,
              decoder_bias=True, classifier_bias=False)


def _row(ours, hf, how=False):
  return mapping.Row(ours, hf, "", how, False)


_ENCODER = (
    _row("model.embeddings.tok_embeddings", "model.embeddings.tok_embeddings.weight"),
    _row("model.embeddings.norm.scale", "model.embeddings.norm.weight"),
    _row(_L + "attn_norm.scale", _HL + "attn_norm.weight"),
    _row(_L + "attn.wqkv", _HL + "attn.Wqkv.weight", _FUSED3),
    _row(_L + "attn.wo.kernel", _HL + "attn.Wo.weight", True),
    _row(_L + "mlp_norm.scale", _HL + "mlp_norm.weight"),
    _row(_L + "mlp.wi", _HL + "mlp.Wi.weight", _FUSED2),
    _row(_L + "mlp.wo.kernel", _HL + "mlp.Wo.weight", True),
    _row("model.final_norm.scale", "model.final_norm.weight"),
)
_HEAD = (
    _row("head.dense.kernel", "head.dense.weight", True),
    _row("head.norm.scale", "head.norm.weight"),
)
# Block 0 has no attention norm (HF: nn.Identity).
_FIRST_LAYER = {_L + "attn_norm.scale": 1}
_SHAPE_FIELDS = {"tok_embeddings": "vocab_size", "decoder": "vocab_size",
                 "mlp.": "intermediate_size"}


# --------------------------------------------------------------------------
# config.json <-> our model config
# --------------------------------------------------------------------------
def config_to_hf(mc, pad_token_id: int = 0,
                 architecture: str = "ModernBertForMaskedLM") -> dict:
  """Our model config -> a ModernBertConfig dict (layer types, RoPE
  parameters per layer type; special ids: ours, [PAD] 0 / [CLS] 2 /
  [SEP] 3, or the export's tokenizer's)."""
  n = int(mc.num_hidden_layers)
  types = ["full_attention" if rope_attention.is_global_layer(mc, i)
           else "sliding_attention" for i in range(n)]
  cls_id, sep_id = 2, 3
  return dict(
      architectures=[architecture], model_type="modernbert",
      vocab_size=int(mc.vocab_size), hidden_size=int(mc.hidden_size),
      intermediate_size=int(mc.intermediate_size), num_hidden_layers=n,
      num_attention_heads=int(mc.num_attention_heads),
      hidden_activation=mc.hidden_act, classifier_activation=mc.hidden_act,
      max_position_embeddings=int(mc.max_position_embeddings),
      initializer_range=float(mc.initializer_range),
      initializer_cutoff_factor=modernbert_model.CUTOFF,
      norm_eps=float(mc.layer_norm_eps),
      pad_token_id=int(pad_token_id), cls_token_id=cls_id,
      bos_token_id=cls_id, sep_token_id=sep_id, eos_token_id=sep_id,
      attention_dropout=float(mc.attention_probs_dropout_prob),
      embedding_dropout=float(mc.hidden_dropout_prob),
      mlp_dropout=float(mc.hidden_dropout_prob),
      classifier_dropout=float(mc.classifier_dropout_prob),
      classifier_pooling=mc.classifier_pooling,
      layer_types=types, local_attention=int(mc.local_attention),
      rope_parameters={
          "full_attention": {"rope_type": "default",
                             "rope_theta": float(mc.global_rope_theta)},
          "sliding_attention": {"rope_type": "default",
                                "rope_theta": float(mc.local_rope_theta)}},
      tie_word_embeddings=True, dtype="float32", **_FIXED)


def _every_n(types) -> int:
  """n of layer_types "full_attention" at 0, n, 2n, ... (else ValueError)."""
  full = [i for i, t in enumerate(types) if t == "full_attention"]
  n = full[1] - full[0] if len(full) > 1 else len(types)
  want = ["full_attention" if i % n == 0 else "sliding_attention"
          for i in range(len(types))]
  if not full or full[0] != 0 or list(types) != want:
    raise ValueError(f"layer_types={list(types)}: this model implements "
                     "full attention at layers 0, n, 2n, ... and a sliding "
                     "window elsewhere (global_attn_every_n_layers).")
  return n


def config_from_hf(hf) -> object:
  """A ModernBertConfig dict (this version's or an older one with
  global_rope_theta / local_rope_theta / global_attn_every_n_layers)
  -> our model config; ValueError for what we do not implement."""
  mc = config_lib.model_config("base")
  mc.update(type_vocab_size=0, layer_norm_eps=1e-5, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
            max_position_embeddings=8192, intermediate_size=1152,
            vocab_size=50368, num_hidden_layers=22)
  for hf_name, ours in (("vocab_size", "vocab_size"),
                        ("hidden_size", "hidden_size"),
                        ("intermediate_size", "intermediate_size"),
                        ("num_hidden_layers", "num_hidden_layers"),
                        ("num_attention_heads", "num_attention_heads"),
                        ("hidden_activation", "hidden_act"),
                        ("max_position_embeddings", "max_position_embeddings"),
                        ("initializer_range", "initializer_range"),
                        ("norm_eps", "layer_norm_eps"),
                        ("attention_dropout", "attention_probs_dropout_prob"),
                        ("mlp_dropout", "hidden_dropout_prob"),
                        ("classifier_dropout", "classifier_dropout_prob"),
                        ("classifier_pooling", "classifier_pooling"),
                        ("local_attention", "local_attention")):
    if hf.get(hf_name) is not None:
      mc[ours] = type(mc[ours])(hf[hf_name])
  for field, want in _FIXED.items():
    if field in hf and bool(hf[field]) != want:
      raise ValueError(f"config.json {field}={hf[field]}: this ModernBERT "
                       f"implements {field}={want} only.")
  act = hf.get("classifier_activation", mc.hidden_act)
  if mc.hidden_act not in layers.ACTIVATIONS or act != mc.hidden_act:
    raise ValueError(
        f"hidden_activation={mc.hidden_act!r} / classifier_activation="
        f"{act!r}: supported is one activation of {tuple(layers.ACTIVATIONS)}"
        " for both.")
  n = int(mc.num_hidden_layers)
  types = hf.get("layer_types") or [
      "sliding_attention" if i % int(hf.get("global_attn_every_n_layers", 3))
      else "full_attention" for i in range(n)]
  mc.global_attn_every_n_layers = _every_n(types)
  rope = hf.get("rope_parameters") or {}
  for layer_type, field, old in (
      ("full_attention", "global_rope_theta", "global_rope_theta"),
      ("sliding_attention", "local_rope_theta", "local_rope_theta")):
    params = rope.get(layer_type) or {}
    if params.get("rope_type", "default") != "default":
      raise ValueError(f"rope_parameters[{layer_type!r}].rope_type="
                       f"{params['rope_type']!r}: only 'default' RoPE is "
                       "implemented.")
    theta = params.get("rope_theta", hf.get(old))
    if theta is not None:
      mc[field] = float(theta)
  labels = hf.get("num_labels") or len(hf.get("id2label") or {})
  if labels:
    mc.num_labels = int(labels)
  modernbert_model.validate_model_config(mc)
  return mc


# --------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------
def _mlm(model_config, rngs):
  return modernbert_model.ModernBertForMaskedLM(model_config, rngs=rngs)


MODERNBERT = Table(
    name="modernbert", model_type="modernbert", make_model=_mlm,
    rows=_ENCODER + _HEAD + (_row("decoder.bias", "decoder.bias"),),
    tied={"decoder.weight": "model.embeddings.tok_embeddings.weight"},
    # ModernBertModel has neither the head nor the decoder.
    heads={"head": "head", "decoder": "decoder"},
    architectures=(("decoder.", "ModernBertForMaskedLM"),),
    default_architecture="ModernBertModel", base_prefix="model.",
    shape_fields=_SHAPE_FIELDS, export_architecture="ModernBertForMaskedLM",
    first_layer=_FIRST_LAYER, masked_lm=True,
    config_to_hf=config_to_hf, config_from_hf=config_from_hf,
)


def make_encoder(model_config, rngs, pooler: bool):
  """ModernBertModel (no pooler: a sentence head pools its tokens)."""
  del pooler
  return modernbert_model.ModernBertModel(model_config, rngs=rngs)


ENCODER = bert_family.encoder_table(
    MODERNBERT, name="modernbert_encoder", architecture="ModernBertModel",
    rows=_ENCODER, attr="model", make=make_encoder,
    config_to_hf=lambda mc, pad_token_id=0: config_to_hf(
        mc, pad_token_id, "ModernBertModel"),
    first_layer=_FIRST_LAYER)


def _prediction_head(model_config, rngs):
  return modernbert_model.PredictionHead(model_config, rngs=rngs)


LAYOUT = heads.HeadLayout(
    pooler_act=None, transform=_prediction_head,
    dropout_field="classifier_dropout_prob", dropout_roles=heads.ROLES,
    output_init=modernbert_model.classifier_init,
    transform_flops=lambda mc: 6.0 * int(mc.hidden_size) ** 2)


def encoder_flops(model_config, work, seq_length: int) -> float:
  return flops_lib.modernbert_encoder_flops(model_config, work, seq_length)


FAMILY = Family(
    name="modernbert", title="ModernBERT", objectives=(modernbert_objective.OBJECTIVE,),
    pretraining_tables=(MODERNBERT,), encoder_table=ENCODER,
    encoder_attr="model", make_encoder=make_encoder, head_layout=LAYOUT,
    pooler_rows=(), transform_rows=_HEAD,
    output_hf={heads.SPAN: "classifier"}, output_tf={},
    encoder_flops=encoder_flops,
    validate_model=modernbert_model.validate_model_config,
    pretrained_encoder_config=lambda config: config.model,
    # The encoder and the prediction head (as HF loads ``head.*`` from a
    # ModernBertForMaskedLM); a task's classifier is fresh.
    pretrained_encoder_params=lambda config, params: {
        "model": params["model"], "head": params["head"]},
    hf_models=default_hf_models)
