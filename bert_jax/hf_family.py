"""Hugging Face tables for ALBERT and DistilBERT, each read both ways.

One table per family maps our param paths to HF state-dict names (with a
transpose for dense kernels: we store (in, out), PyTorch (out, in)); export
and import walk the same rows. HF names that are copies of another row (tied
decoders) are written on export and checked on import. The config maps the
same way (HF field names are ours where they exist).

Until ``bert_jax/hf/mapping.py`` (the per-family registry) lands this module
holds the two tables; they are plain data and move there unchanged.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

# Row: (our path, HF name, transpose?). "{g}"/"{k}" (ALBERT group / inner
# layer) and "{i}" (DistilBERT layer) are expanded per config.
_ALBERT_LAYER = (
    ("attention.query.kernel", "attention.query.weight", True),
    ("attention.query.bias", "attention.query.bias", False),
    ("attention.key.kernel", "attention.key.weight", True),
    ("attention.key.bias", "attention.key.bias", False),
    ("attention.value.kernel", "attention.value.weight", True),
    ("attention.value.bias", "attention.value.bias", False),
    ("attention.output.kernel", "attention.dense.weight", True),
    ("attention.output.bias", "attention.dense.bias", False),
    ("attention.layer_norm.scale", "attention.LayerNorm.weight", False),
    ("attention.layer_norm.bias", "attention.LayerNorm.bias", False),
    ("feed_forward.intermediate.kernel", "ffn.weight", True),
    ("feed_forward.intermediate.bias", "ffn.bias", False),
    ("feed_forward.output.kernel", "ffn_output.weight", True),
    ("feed_forward.output.bias", "ffn_output.bias", False),
    ("feed_forward.layer_norm.scale", "full_layer_layer_norm.weight", False),
    ("feed_forward.layer_norm.bias", "full_layer_layer_norm.bias", False),
)
_ALBERT = (
    ("albert.embeddings.word_embeddings", "albert.embeddings.word_embeddings.weight", False),
    ("albert.embeddings.position_embeddings", "albert.embeddings.position_embeddings.weight", False),
    ("albert.embeddings.token_type_embeddings", "albert.embeddings.token_type_embeddings.weight", False),
    ("albert.embeddings.layer_norm.scale", "albert.embeddings.LayerNorm.weight", False),
    ("albert.embeddings.layer_norm.bias", "albert.embeddings.LayerNorm.bias", False),
    ("albert.embeddings.embeddings_project.kernel", "albert.encoder.embedding_hidden_mapping_in.weight", True),
    ("albert.embeddings.embeddings_project.bias", "albert.encoder.embedding_hidden_mapping_in.bias", False),
    *((f"albert.groups.{{g}}.layers.{{k}}.{ours}",
       f"albert.encoder.albert_layer_groups.{{g}}.albert_layers.{{k}}.{hf}", t)
      for ours, hf, t in _ALBERT_LAYER),
    ("albert.pooler.kernel", "albert.pooler.weight", True),
    ("albert.pooler.bias", "albert.pooler.bias", False),
    ("mlm_head.transform.kernel", "predictions.dense.weight", True),
    ("mlm_head.transform.bias", "predictions.dense.bias", False),
    ("mlm_head.layer_norm.scale", "predictions.LayerNorm.weight", False),
    ("mlm_head.layer_norm.bias", "predictions.LayerNorm.bias", False),
    ("mlm_head.bias", "predictions.bias", False),
    ("sop_head.kernel", "sop_classifier.classifier.weight", True),
    ("sop_head.bias", "sop_classifier.classifier.bias", False),
)
_DISTILBERT = (
    ("bert.embeddings.word_embeddings", "distilbert.embeddings.word_embeddings.weight", False),
    ("bert.embeddings.position_embeddings", "distilbert.embeddings.position_embeddings.weight", False),
    ("bert.embeddings.layer_norm.scale", "distilbert.embeddings.LayerNorm.weight", False),
    ("bert.embeddings.layer_norm.bias", "distilbert.embeddings.LayerNorm.bias", False),
    *((f"bert.layers.{{i}}.{ours}", f"distilbert.transformer.layer.{{i}}.{hf}", t)
      for ours, hf, t in (
          ("attention.query.kernel", "attention.q_lin.weight", True),
          ("attention.query.bias", "attention.q_lin.bias", False),
          ("attention.key.kernel", "attention.k_lin.weight", True),
          ("attention.key.bias", "attention.k_lin.bias", False),
          ("attention.value.kernel", "attention.v_lin.weight", True),
          ("attention.value.bias", "attention.v_lin.bias", False),
          ("attention.output.kernel", "attention.out_lin.weight", True),
          ("attention.output.bias", "attention.out_lin.bias", False),
          ("attention.layer_norm.scale", "sa_layer_norm.weight", False),
          ("attention.layer_norm.bias", "sa_layer_norm.bias", False),
          ("feed_forward.intermediate.kernel", "ffn.lin1.weight", True),
          ("feed_forward.intermediate.bias", "ffn.lin1.bias", False),
          ("feed_forward.output.kernel", "ffn.lin2.weight", True),
          ("feed_forward.output.bias", "ffn.lin2.bias", False),
          ("feed_forward.layer_norm.scale", "output_layer_norm.weight", False),
          ("feed_forward.layer_norm.bias", "output_layer_norm.bias", False),
      )),
    ("mlm_head.transform.kernel", "vocab_transform.weight", True),
    ("mlm_head.transform.bias", "vocab_transform.bias", False),
    ("mlm_head.layer_norm.scale", "vocab_layer_norm.weight", False),
    ("mlm_head.layer_norm.bias", "vocab_layer_norm.bias", False),
    ("mlm_head.bias", "vocab_projector.bias", False),
)

# HF name -> the HF name it is a copy of (tied decoder weight and bias).
TIED = {
    "albert": {"predictions.decoder.weight":
                   "albert.embeddings.word_embeddings.weight",
               "predictions.decoder.bias": "predictions.bias"},
    "distilbert": {"vocab_projector.weight":
                       "distilbert.embeddings.word_embeddings.weight"},
}
ARCHITECTURES = {"albert": "AlbertForPreTraining",
                 "distilbert": "DistilBertForMaskedLM"}


def table(family: str, model_config) -> list[tuple[str, str, bool]]:
  """The family's rows expanded for this config."""
  if family == "albert":
    rows = []
    for ours, hf, t in _ALBERT:
      if "{g}" in ours:
        rows += [(ours.format(g=g, k=k), hf.format(g=g, k=k), t)
                 for g in range(model_config.num_hidden_groups)
                 for k in range(model_config.inner_group_num)]
      elif "embeddings_project" in ours and not model_config.embedding_size:
        continue
      else:
        rows.append((ours, hf, t))
    return rows
  if family == "distilbert":
    return [r2 for ours, hf, t in _DISTILBERT for r2 in (
        [(ours.format(i=i), hf.format(i=i), t)
         for i in range(model_config.num_hidden_layers)]
        if "{i}" in ours else [(ours, hf, t)])]
  raise ValueError(f"Unknown Hugging Face family {family!r}; use one of "
                   f"{tuple(ARCHITECTURES)}.")


def _get(tree, path: str):
  for k in path.split("."):
    tree = tree[int(k) if k.isdigit() and int(k) in tree else k]
  return tree


def _set(tree: dict, path: str, value) -> None:
  keys = [int(k) if k.isdigit() else k for k in path.split(".")]
  for k in keys[:-1]:
    tree = tree.setdefault(k, {})
  tree[keys[-1]] = value


def to_hf_state_dict(family: str, params, model_config) -> dict:
  """Our params (pure dict) -> {HF name: float32 array}, tied copies included."""
  sd = {}
  for ours, hf, t in table(family, model_config):
    x = np.asarray(_get(params, ours), np.float32)
    sd[hf] = np.ascontiguousarray(x.T if t else x)
  for name, source in TIED[family].items():
    sd[name] = sd[source].copy()
  return sd


def from_hf_state_dict(family: str, state_dict: Mapping[str, Any],
                       model_config) -> dict:
  """{HF name: array} -> our params; raises naming any missing or extra key
  and any tied copy that differs from its source."""
  sd = {k: np.asarray(v, np.float32) for k, v in state_dict.items()
        if not k.endswith("position_ids")}
  rows = table(family, model_config)
  missing = [hf for _, hf, _ in rows if hf not in sd]
  if missing:
    raise ValueError(f"The {ARCHITECTURES[family]} checkpoint lacks "
                     f"{len(missing)} weight(s), e.g. {missing[:3]}; is it "
                     f"a {family} model with this config?")
  extra = set(sd) - {hf for _, hf, _ in rows} - set(TIED[family])
  if extra:
    raise ValueError(f"Unexpected {family} weight(s) {sorted(extra)[:3]}.")
  for name, source in TIED[family].items():
    if name in sd and not np.array_equal(sd[name], sd[source]):
      raise ValueError(f"{name} differs from {source}, to which it is tied.")
  params: dict = {}
  for ours, hf, t in rows:
    _set(params, ours, sd[hf].T.copy() if t else sd[hf])
  return params


# ---------------------------------------------------------------------------
# Configs.
# ---------------------------------------------------------------------------
_DISTIL_FIELDS = (("dim", "hidden_size"), ("n_layers", "num_hidden_layers"),
                  ("n_heads", "num_attention_heads"),
                  ("hidden_dim", "intermediate_size"),
                  ("dropout", "hidden_dropout_prob"),
                  ("attention_dropout", "attention_probs_dropout_prob"),
                  ("activation", "hidden_act"))
_SHARED_FIELDS = ("vocab_size", "max_position_embeddings", "initializer_range")
_ALBERT_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads",
                  "intermediate_size", "hidden_act", "hidden_dropout_prob",
                  "attention_probs_dropout_prob", "type_vocab_size",
                  "layer_norm_eps", "embedding_size", "num_hidden_groups",
                  "inner_group_num", "classifier_dropout_prob")


def hf_config(family: str, model_config, pad_token_id: int = 0) -> dict:
  """Our model config -> the family's HF config.json dict."""
  mc = model_config
  cfg = {"architectures": [ARCHITECTURES[family]], "model_type": family,
         "pad_token_id": int(pad_token_id), "tie_word_embeddings": True}
  for f in _SHARED_FIELDS:
    cfg[f] = mc[f]
  if family == "albert":
    if mc.embedding_size in (0, mc.hidden_size):
      raise ValueError(
          f"model.embedding_size={mc.embedding_size}: an AlbertForPreTraining "
          "export needs factorized embeddings (0 < embedding_size != "
          "hidden_size, e.g. 128).")
    for f in _ALBERT_FIELDS:
      cfg[f] = mc[f]
  else:
    if mc.type_vocab_size:
      raise ValueError(f"model.type_vocab_size={mc.type_vocab_size}: "
                       "DistilBERT has no segment embeddings (set it to 0).")
    for hf, ours in _DISTIL_FIELDS:
      cfg[hf] = mc[ours]
    cfg.update(sinusoidal_pos_embds=False)
  return cfg


def model_config_from_hf(hf_cfg: Mapping[str, Any]):
  """(family, our model config) from an ALBERT or DistilBERT config.json."""
  from bert_jax import config_lib
  family = hf_cfg.get("model_type")
  if family not in ARCHITECTURES:
    raise ValueError(f"config.json model_type={family!r} is not one of "
                     f"{tuple(ARCHITECTURES)}.")
  mc = config_lib.model_config("base")
  for f in _SHARED_FIELDS:
    mc[f] = type(mc[f])(hf_cfg[f])
  if family == "albert":
    for f in _ALBERT_FIELDS:
      if f in hf_cfg:
        mc[f] = type(mc[f])(hf_cfg[f])
  else:
    for hf, ours in _DISTIL_FIELDS:
      mc[ours] = type(mc[ours])(hf_cfg[hf])
    mc.type_vocab_size = 0
    if hf_cfg.get("sinusoidal_pos_embds"):
      raise ValueError("sinusoidal_pos_embds=True DistilBERT checkpoints are "
                       "not supported (learned positions only).")
  return family, mc


def save(out_dir: str, family: str, params, model_config, *,
         pad_token_id: int = 0) -> list[str]:
  """Write config.json + model.safetensors (float32) for the family."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  save_file(to_hf_state_dict(family, params, model_config),
            os.path.join(out_dir, "model.safetensors"),
            metadata={"format": "pt"})
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(hf_config(family, model_config, pad_token_id), f, indent=2)
  return ["config.json", "model.safetensors"]


def load(path: str):
  """(family, params, model config) from an HF ALBERT / DistilBERT dir."""
  from safetensors.numpy import load_file
  cfg_path = os.path.join(path, "config.json")
  weights = os.path.join(path, "model.safetensors")
  for p in (cfg_path, weights):
    if not os.path.exists(p):
      raise FileNotFoundError(f"{p} not found: a Hugging Face ALBERT or "
                              "DistilBERT directory has config.json and "
                              "model.safetensors.")
  with open(cfg_path) as f:
    family, mc = model_config_from_hf(json.load(f))
  params = from_hf_state_dict(family, load_file(weights), mc)
  return family, params, mc


def family_of(params) -> str:
  """"albert", "distilbert" (BertForMaskedLM layout: no pooler, no NSP) or
  "bert" (BertForPreTraining), from a param tree's structure."""
  if "albert" in params:
    return "albert"
  if "nsp_head" not in params and "pooler" not in params.get("bert", {}):
    return "distilbert"
  return "bert"


def make_model(family: str, params, model_config):
  """An nnx module of the family holding `params` (float32 compute)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from bert_jax import albert  # pylint: disable=g-import-not-at-top
  from bert_jax import model as model_lib  # pylint: disable=g-import-not-at-top
  cls = {"albert": albert.AlbertForPreTraining,
         "distilbert": model_lib.BertForMaskedLM}[family]
  cfg = model_config.copy_and_resolve_references()
  cfg.dtype = "float32"
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: cls(cfg, rngs=nnx.Rngs(0))), nnx.Param)
  nnx.replace_by_pure_dict(state, jax_tree_float32(params))
  return nnx.merge(graphdef, state)


def jax_tree_float32(params):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.map(lambda x: np.asarray(x, np.float32), params)
