"""Hugging Face <-> bert_jax: one parameter table, used in both directions.

Our module tree mirrors ``transformers.BertForPreTraining`` (see ``model.py``),
so conversion is renaming plus a transpose of dense kernels. Everything here is
numpy + safetensors + tokenizers: no torch, no TensorFlow, no mesh. torch is
imported only to read a ``pytorch_model.bin``; TensorFlow only to read one of
Google's original TF checkpoints.

Public functions
  to_hf_state_dict(params)                  our tree -> {HF name: fp32 array}
  from_hf_state_dict(sd, model_config)      {HF or TF name: array} -> (our tree, ImportReport)
  hf_config_from_model_config(model_config) our model config -> config.json dict
  model_config_from_hf_config(hf_config)    config.json dict -> our model config
  read_hf_state_dict(path)                  safetensors / pytorch_model.bin / TF checkpoint -> dict
  load_hf_params(path, model_config=None)   path -> (our tree, ImportReport)
  save_hf_model(out, params, model_config, tokenizer=...)  writes an HF directory
  make_model(params, model_config)          an nnx BertForPreTraining holding params
  load_init_params(path, model_config)      what the trainer calls for train.init_from
  build_hf_tokenizer / write_hf_tokenizer_files / load_hf_tokenizer: tokenizer files
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import json
import logging
import os
import re
import shutil
from typing import Any, Mapping

import numpy as np

# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------
# (our path, HF name, Google TF name, transpose to/from HF, transpose to/from TF)
# "{i}" is the encoder layer index. Our dense kernels are (in, out); HF Linear
# weights are (out, in); Google's TF kernels are (in, out) like ours, except
# cls/seq_relationship/output_weights, which is (2, hidden) like HF.
PARAM_TABLE: tuple[tuple[str, str, str, bool, bool], ...] = (
    ("bert.embeddings.word_embeddings", "bert.embeddings.word_embeddings.weight", "bert/embeddings/word_embeddings", False, False),
    ("bert.embeddings.position_embeddings", "bert.embeddings.position_embeddings.weight", "bert/embeddings/position_embeddings", False, False),
    ("bert.embeddings.token_type_embeddings", "bert.embeddings.token_type_embeddings.weight", "bert/embeddings/token_type_embeddings", False, False),
    ("bert.embeddings.layer_norm.scale", "bert.embeddings.LayerNorm.weight", "bert/embeddings/LayerNorm/gamma", False, False),
    ("bert.embeddings.layer_norm.bias", "bert.embeddings.LayerNorm.bias", "bert/embeddings/LayerNorm/beta", False, False),
    ("bert.layers.{i}.attention.query.kernel", "bert.encoder.layer.{i}.attention.self.query.weight", "bert/encoder/layer_{i}/attention/self/query/kernel", True, False),
    ("bert.layers.{i}.attention.query.bias", "bert.encoder.layer.{i}.attention.self.query.bias", "bert/encoder/layer_{i}/attention/self/query/bias", False, False),
    ("bert.layers.{i}.attention.key.kernel", "bert.encoder.layer.{i}.attention.self.key.weight", "bert/encoder/layer_{i}/attention/self/key/kernel", True, False),
    ("bert.layers.{i}.attention.key.bias", "bert.encoder.layer.{i}.attention.self.key.bias", "bert/encoder/layer_{i}/attention/self/key/bias", False, False),
    ("bert.layers.{i}.attention.value.kernel", "bert.encoder.layer.{i}.attention.self.value.weight", "bert/encoder/layer_{i}/attention/self/value/kernel", True, False),
    ("bert.layers.{i}.attention.value.bias", "bert.encoder.layer.{i}.attention.self.value.bias", "bert/encoder/layer_{i}/attention/self/value/bias", False, False),
    ("bert.layers.{i}.attention.output.kernel", "bert.encoder.layer.{i}.attention.output.dense.weight", "bert/encoder/layer_{i}/attention/output/dense/kernel", True, False),
    ("bert.layers.{i}.attention.output.bias", "bert.encoder.layer.{i}.attention.output.dense.bias", "bert/encoder/layer_{i}/attention/output/dense/bias", False, False),
    ("bert.layers.{i}.attention.layer_norm.scale", "bert.encoder.layer.{i}.attention.output.LayerNorm.weight", "bert/encoder/layer_{i}/attention/output/LayerNorm/gamma", False, False),
    ("bert.layers.{i}.attention.layer_norm.bias", "bert.encoder.layer.{i}.attention.output.LayerNorm.bias", "bert/encoder/layer_{i}/attention/output/LayerNorm/beta", False, False),
    ("bert.layers.{i}.feed_forward.intermediate.kernel", "bert.encoder.layer.{i}.intermediate.dense.weight", "bert/encoder/layer_{i}/intermediate/dense/kernel", True, False),
    ("bert.layers.{i}.feed_forward.intermediate.bias", "bert.encoder.layer.{i}.intermediate.dense.bias", "bert/encoder/layer_{i}/intermediate/dense/bias", False, False),
    ("bert.layers.{i}.feed_forward.output.kernel", "bert.encoder.layer.{i}.output.dense.weight", "bert/encoder/layer_{i}/output/dense/kernel", True, False),
    ("bert.layers.{i}.feed_forward.output.bias", "bert.encoder.layer.{i}.output.dense.bias", "bert/encoder/layer_{i}/output/dense/bias", False, False),
    ("bert.layers.{i}.feed_forward.layer_norm.scale", "bert.encoder.layer.{i}.output.LayerNorm.weight", "bert/encoder/layer_{i}/output/LayerNorm/gamma", False, False),
    ("bert.layers.{i}.feed_forward.layer_norm.bias", "bert.encoder.layer.{i}.output.LayerNorm.bias", "bert/encoder/layer_{i}/output/LayerNorm/beta", False, False),
    ("bert.pooler.kernel", "bert.pooler.dense.weight", "bert/pooler/dense/kernel", True, False),
    ("bert.pooler.bias", "bert.pooler.dense.bias", "bert/pooler/dense/bias", False, False),
    ("mlm_head.transform.kernel", "cls.predictions.transform.dense.weight", "cls/predictions/transform/dense/kernel", True, False),
    ("mlm_head.transform.bias", "cls.predictions.transform.dense.bias", "cls/predictions/transform/dense/bias", False, False),
    ("mlm_head.layer_norm.scale", "cls.predictions.transform.LayerNorm.weight", "cls/predictions/transform/LayerNorm/gamma", False, False),
    ("mlm_head.layer_norm.bias", "cls.predictions.transform.LayerNorm.bias", "cls/predictions/transform/LayerNorm/beta", False, False),
    ("mlm_head.bias", "cls.predictions.bias", "cls/predictions/output_bias", False, False),
    ("nsp_head.kernel", "cls.seq_relationship.weight", "cls/seq_relationship/output_weights", True, True),
    ("nsp_head.bias", "cls.seq_relationship.bias", "cls/seq_relationship/output_bias", False, False),
)

# HF keys that are copies of other keys (the MLM decoder is tied to the word
# embeddings, and its bias is ``cls.predictions.bias``). Written on export so
# that any loader, tying or not, gets the right decoder; on import they are
# checked against their source instead of being loaded twice.
TIED_HF_KEYS = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}

# Heads: our path prefix -> HF name prefix. Any of them may be absent from a
# source checkpoint (BertModel has no cls.*, BertForMaskedLM no pooler/NSP).
HEADS = {
    "bert.pooler": "bert.pooler",
    "mlm_head": "cls.predictions",
    "nsp_head": "cls.seq_relationship",
}

# Keys that are buffers, not parameters, in some HF checkpoints.
_HF_BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids)$")
# Google TF checkpoint entries that are training state, not weights.
_TF_TRAINING_STATE = re.compile(r"(/adam_[mv]$|/Adam(_1)?$|/LAMB(_1)?$|^global_step$|_power$)")

# HF BertConfig fields that our model config shares, by the same name.
MODEL_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size", "hidden_act",
                "hidden_dropout_prob", "attention_probs_dropout_prob",
                "max_position_embeddings", "type_vocab_size",
                "initializer_range", "layer_norm_eps")

UNTRAINED_HEADS_NOTE = "UNTRAINED_HEADS.md"


def table(num_layers: int) -> list[tuple[str, str, str, bool, bool]]:
  """The table with "{i}" expanded for `num_layers` encoder layers."""
  rows = []
  for ours, hf, tf, t_hf, t_tf in PARAM_TABLE:
    if "{i}" in ours:
      rows += [(ours.format(i=i), hf.format(i=i), tf.format(i=i), t_hf, t_tf)
               for i in range(num_layers)]
    else:
      rows.append((ours, hf, tf, t_hf, t_tf))
  return rows


# --------------------------------------------------------------------------
# Param trees
# --------------------------------------------------------------------------

def flatten_params(params: Mapping[str, Any]) -> dict[str, Any]:
  """Nested dict (int or str layer keys) -> {"bert.layers.0.attention...": leaf}."""
  flat = {}

  def visit(prefix, node):
    if isinstance(node, Mapping) or hasattr(node, "items") and not hasattr(
        node, "shape"):
      for k, v in node.items():
        visit(f"{prefix}.{k}" if prefix else str(k), v)
    else:
      flat[prefix] = node

  visit("", params)
  return flat


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
  """Inverse of flatten_params; numeric keys become ints (as nnx.List uses)."""
  tree: dict = {}
  for path, leaf in flat.items():
    node = tree
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = leaf
  return tree


def num_layers_of(params: Mapping[str, Any]) -> int:
  flat = flatten_params(params)
  idx = {int(k.split(".")[2]) for k in flat if k.startswith("bert.layers.")}
  return max(idx) + 1 if idx else 0


def _f32(x) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x).astype(np.float32))


def to_hf_state_dict(params: Mapping[str, Any], *,
                     include_tied: bool = True) -> dict[str, np.ndarray]:
  """Our param tree -> {HF BertForPreTraining name: float32 numpy array}.

  Always float32, whatever the compute dtype was. With `include_tied`, the tied
  decoder weight/bias are written as explicit copies.
  """
  flat = flatten_params(params)
  rows = table(num_layers_of(params))
  expected = {r[0] for r in rows}
  extra = sorted(set(flat) - expected)
  missing = sorted(expected - set(flat))
  if extra or missing:
    raise ValueError(f"Param tree does not match the BERT table: missing "
                     f"{missing[:5]}, unexpected {extra[:5]}.")
  sd = {}
  for ours, hf, _, t_hf, _ in rows:
    x = _f32(flat[ours])
    sd[hf] = np.ascontiguousarray(x.T) if t_hf else x
  if include_tied:
    for tied, src in TIED_HF_KEYS.items():
      sd[tied] = sd[src].copy()
  return sd


@dataclasses.dataclass
class ImportReport:
  """What an import did: what was loaded, initialized fresh, or skipped."""
  source: str = ""
  format: str = ""  # "safetensors", "pytorch_bin", "tf_checkpoint", "bert_jax"
  architecture: str = ""  # BertForPreTraining / BertForMaskedLM / BertModel
  loaded: list = dataclasses.field(default_factory=list)  # our paths
  fresh: list = dataclasses.field(default_factory=list)  # our head prefixes
  skipped: list = dataclasses.field(default_factory=list)  # source keys
  notes: list = dataclasses.field(default_factory=list)

  def summary(self) -> str:
    lines = [f"Imported {len(self.loaded)} tensors from {self.source} "
             f"({self.format}, {self.architecture or 'unknown architecture'})."]
    if self.fresh:
      lines.append("Initialized fresh (absent from the source): "
                   + ", ".join(self.fresh) + ".")
    if self.skipped:
      shown = ", ".join(self.skipped[:8])
      more = f" (+{len(self.skipped) - 8} more)" if len(self.skipped) > 8 else ""
      lines.append(f"Skipped {len(self.skipped)} source keys: {shown}{more}.")
    lines += self.notes
    return "\n".join(lines)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  def __str__(self) -> str:
    return self.summary()


def _canonical_hf_name(name: str) -> str:
  """Map the naming variants of HF checkpoints onto BertForPreTraining names."""
  for prefix in ("module.", "model."):
    if name.startswith(prefix):
      name = name[len(prefix):]
  # Old PyTorch checkpoints name LayerNorm params gamma/beta.
  name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
  name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
  # BertModel checkpoints have no "bert." prefix.
  if name.startswith(("embeddings.", "encoder.", "pooler.")):
    name = "bert." + name
  return name


def _guess_architecture(names) -> str:
  names = set(names)
  if "cls.seq_relationship.weight" in names:
    return "BertForPreTraining"
  if any(n.startswith("cls.predictions.") for n in names):
    return "BertForMaskedLM"
  return "BertModel"


def _init_params(model_config, seed: int) -> dict[str, np.ndarray]:
  """A freshly initialized param tree, flattened, as numpy float32."""
  from flax import nnx

  from bert_jax import model as model_lib
  m = model_lib.BertForPreTraining(model_config, rngs=nnx.Rngs(seed))
  flat = flatten_params(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  return {k: np.asarray(v, np.float32) for k, v in flat.items()}


def _expected_shapes(model_config) -> dict[str, tuple]:
  from flax import nnx

  from bert_jax import model as model_lib
  abstract = nnx.eval_shape(
      lambda: model_lib.BertForPreTraining(model_config, rngs=nnx.Rngs(0)))
  flat = flatten_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
  return {k: tuple(v.shape) for k, v in flat.items()}


_SHAPE_FIELDS = {
    "word_embeddings": "vocab_size", "mlm_head.bias": "vocab_size",
    "position_embeddings": "max_position_embeddings",
    "token_type_embeddings": "type_vocab_size",
    "intermediate": "intermediate_size",
}


def from_hf_state_dict(state_dict: Mapping[str, Any], model_config, *,
                       seed: int = 0, source: str = "",
                       fmt: str = "") -> tuple[dict, ImportReport]:
  """{HF (any Bert* class) or Google TF name: array} -> (our tree, report).

  Heads missing from the source are initialized fresh (seeded) and listed in
  the report; keys we have no use for are listed as skipped; optimizer slots
  and global_step of TF checkpoints are skipped silently (counted in a note).
  Raises ValueError naming the tensor and the config field on a shape mismatch.
  """
  n_layers = int(model_config.num_hidden_layers)
  rows = table(n_layers)
  by_hf = {hf: (ours, t) for ours, hf, _, t, _ in rows}
  by_tf = {tf: (ours, t) for ours, _, tf, _, t in rows}
  report = ImportReport(source=source, format=fmt)

  found: dict[str, np.ndarray] = {}
  seen_hf: dict[str, np.ndarray] = {}
  n_training_state = 0
  dtypes = set()
  for name, value in state_dict.items():
    if "/" in name or name == "global_step":  # Google TF checkpoint naming.
      if _TF_TRAINING_STATE.search(name):
        n_training_state += 1
        continue
      if name in by_tf:
        ours, transpose = by_tf[name]
      else:
        report.skipped.append(name)
        continue
      hf_name = None
    else:
      hf_name = _canonical_hf_name(name)
      if _HF_BUFFERS.search(hf_name):
        continue
      if hf_name in TIED_HF_KEYS:
        seen_hf[hf_name] = np.asarray(value)
        continue
      if hf_name not in by_hf:
        report.skipped.append(name)
        continue
      ours, transpose = by_hf[hf_name]
      seen_hf[hf_name] = np.asarray(value)
    arr = np.asarray(value)
    dtypes.add(str(arr.dtype))
    arr = _f32(arr)
    found[ours] = np.ascontiguousarray(arr.T) if transpose else arr
  # Some exports carry only the decoder bias, not cls.predictions.bias.
  if "mlm_head.bias" not in found and "cls.predictions.decoder.bias" in seen_hf:
    found["mlm_head.bias"] = _f32(seen_hf["cls.predictions.decoder.bias"])
  # A tied decoder that is not a copy of the embeddings cannot be represented.
  dec = seen_hf.get("cls.predictions.decoder.weight")
  emb = seen_hf.get("bert.embeddings.word_embeddings.weight")
  if dec is not None and emb is not None and not np.array_equal(
      np.asarray(dec, np.float32), np.asarray(emb, np.float32)):
    raise ValueError("cls.predictions.decoder.weight differs from "
                     "bert.embeddings.word_embeddings.weight: this model's "
                     "MLM decoder is tied, an untied decoder cannot be imported.")

  stray_layers = [k for k in report.skipped
                  if re.search(r"(encoder\.layer\.|encoder/layer_)\d+", k)]
  if stray_layers:
    raise ValueError(
        f"The source has encoder layers beyond model.num_hidden_layers="
        f"{n_layers} (e.g. {stray_layers[0]}); set num_hidden_layers to match.")

  shapes = _expected_shapes(model_config)
  for ours, arr in found.items():
    if tuple(arr.shape) != shapes[ours]:
      field = next((f for k, f in _SHAPE_FIELDS.items() if k in ours),
                   "hidden_size")
      raise ValueError(
          f"{ours}: the source has shape {tuple(arr.shape)}, this model config "
          f"expects {shapes[ours]}; check model.{field}="
          f"{model_config[field]}.")

  missing = sorted(set(shapes) - set(found))
  if missing:
    non_head = [m for m in missing
                if not any(m.startswith(h) for h in HEADS)]
    if non_head:
      raise ValueError(f"The source lacks encoder weights: {non_head[:5]}.")
    fresh = _init_params(model_config, seed)
    for m in missing:
      found[m] = fresh[m]
    report.fresh = sorted({h for h in HEADS for m in missing
                           if m.startswith(h)})
    partial = [h for h in report.fresh
               if any(k.startswith(h) for k in found if k not in missing)]
    if partial:
      report.notes.append(f"Heads only partly present in the source, "
                          f"completed fresh: {partial}.")
  report.loaded = sorted(k for k in found if k not in set(missing))
  report.architecture = _guess_architecture(
      [_canonical_hf_name(n) for n in state_dict if "/" not in n]
      or [h for ours, h, tf, _, _ in rows if ours in found and ours not in missing])
  if n_training_state:
    report.notes.append(f"Skipped {n_training_state} optimizer slots / "
                        "global_step entries of the TF checkpoint.")
  if dtypes - {"float32"}:
    report.notes.append(f"Source dtype(s) {sorted(dtypes)} cast to float32.")
  return unflatten_params(found), report


def make_model(params: Mapping[str, Any], model_config, *,
               dtype: str | None = "float32"):
  """An nnx BertForPreTraining holding `params` (no random init is run).

  `dtype` overrides the compute dtype (float32 for exact comparisons; None
  keeps model_config.dtype).
  """
  from flax import nnx

  from bert_jax import model as model_lib
  cfg = model_config.copy_and_resolve_references()
  if dtype is not None:
    cfg.dtype = dtype
  abstract = nnx.eval_shape(
      lambda: model_lib.BertForPreTraining(cfg, rngs=nnx.Rngs(0)))
  graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
  pure = unflatten_params({k: np.asarray(v, np.float32)
                           for k, v in flatten_params(params).items()})
  nnx.replace_by_pure_dict(state, pure)
  return nnx.merge(graphdef, state, rest)


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------

def hf_config_from_model_config(model_config, *, pad_token_id: int = 0,
                                architectures=("BertForPreTraining",),
                                extra: Mapping[str, Any] | None = None) -> dict:
  """Our model config -> an HF BertConfig dict (config.json)."""
  cfg = {"architectures": list(architectures), "model_type": "bert"}
  for f in MODEL_FIELDS:
    cfg[f] = model_config[f]
  for f in ("vocab_size", "hidden_size", "num_hidden_layers",
            "num_attention_heads", "intermediate_size",
            "max_position_embeddings", "type_vocab_size"):
    cfg[f] = int(cfg[f])
  for f in ("hidden_dropout_prob", "attention_probs_dropout_prob",
            "initializer_range", "layer_norm_eps"):
    cfg[f] = float(cfg[f])
  cfg.update(pad_token_id=int(pad_token_id), position_embedding_type="absolute",
             tie_word_embeddings=True, dtype="float32")
  if extra:
    cfg.update(extra)
  return cfg


def model_config_from_hf_config(hf_config: Mapping[str, Any]):
  """An HF BertConfig dict (or Google bert_config.json) -> our model config."""
  from bert_jax import config_lib
  cfg = config_lib.model_config("base")
  for f in MODEL_FIELDS:
    if f in hf_config:
      cfg[f] = type(cfg[f])(hf_config[f])
  if "intermediate_size" not in hf_config:
    cfg.intermediate_size = 4 * cfg.hidden_size
  if "num_attention_heads" not in hf_config:
    cfg.num_attention_heads = cfg.hidden_size // 64
  model_type = hf_config.get("model_type", "bert")
  if model_type != "bert":
    raise ValueError(f"config.json model_type={model_type!r}: only 'bert' "
                     "checkpoints can be imported.")
  pos = hf_config.get("position_embedding_type", "absolute")
  if pos != "absolute":
    raise ValueError(f"position_embedding_type={pos!r} is not supported "
                     "(only 'absolute').")
  if cfg.hidden_act != "gelu":
    raise ValueError(f"hidden_act={cfg.hidden_act!r} is not supported; this "
                     "model implements exact (erf) 'gelu' only.")
  return cfg


# --------------------------------------------------------------------------
# Reading checkpoints
# --------------------------------------------------------------------------

def _find_tf_checkpoint(path: str) -> str | None:
  """A TF checkpoint prefix for `path` (a prefix, or a dir holding one)."""
  if os.path.exists(path + ".index"):
    return path
  if os.path.isdir(path):
    indexes = sorted(glob.glob(os.path.join(path, "*.index")))
    if indexes:
      return indexes[-1][: -len(".index")]
  return None


def _load_safetensors(path: str) -> dict[str, np.ndarray]:
  """safetensors -> numpy; bfloat16 tensors (numpy has none) become float32."""
  from safetensors import safe_open
  from safetensors.numpy import load_file
  try:
    return load_file(path)
  except TypeError:  # bfloat16: read through JAX, which has the dtype.
    import jax.numpy as jnp
    with safe_open(path, framework="flax") as f:
      return {k: np.asarray(f.get_tensor(k).astype(jnp.float32))
              for k in f.keys()}


def read_hf_state_dict(path: str) -> tuple[dict[str, np.ndarray], str]:
  """Read weights from an HF directory or a TF checkpoint -> (dict, format).

  Formats, in order of preference: model.safetensors (or a sharded
  model.safetensors.index.json), pytorch_model.bin (needs torch), a Google TF
  checkpoint (needs TensorFlow; prefix or a directory with one).
  """
  load_file = _load_safetensors
  if os.path.isfile(path) and path.endswith(".safetensors"):
    return load_file(path), "safetensors"
  single = os.path.join(path, "model.safetensors")
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.isfile(single):
    return load_file(single), "safetensors"
  if os.path.isfile(index):
    with open(index) as f:
      files = sorted(set(json.load(f)["weight_map"].values()))
    sd = {}
    for name in files:
      sd.update(load_file(os.path.join(path, name)))
    return sd, "safetensors"
  binfile = path if path.endswith(".bin") else os.path.join(
      path, "pytorch_model.bin")
  if os.path.isfile(binfile):
    import torch  # Lazy: only this format needs torch.
    sd = torch.load(binfile, map_location="cpu", weights_only=True)
    return {k: v.detach().float().numpy() if v.dtype == torch.bfloat16
            else v.detach().numpy() for k, v in sd.items()}, "pytorch_bin"
  prefix = _find_tf_checkpoint(path)
  if prefix is not None:
    import tensorflow as tf  # Lazy: only Google's TF checkpoints need it.
    reader = tf.train.load_checkpoint(prefix)
    names = reader.get_variable_to_shape_map()
    return {n: reader.get_tensor(n) for n in sorted(names)
            if not _TF_TRAINING_STATE.search(n)} | {
                n: np.zeros(()) for n in names
                if _TF_TRAINING_STATE.search(n)}, "tf_checkpoint"
  raise FileNotFoundError(
      f"No model.safetensors, pytorch_model.bin or TF checkpoint in {path}.")


def read_hf_config(path: str) -> dict | None:
  """config.json (HF) or bert_config.json (Google) next to the weights."""
  base = path if os.path.isdir(path) else os.path.dirname(path)
  for name in ("config.json", "bert_config.json"):
    p = os.path.join(base, name)
    if os.path.isfile(p):
      with open(p) as f:
        return json.load(f)
  return None


def load_hf_params(path: str, model_config=None, *,
                   seed: int = 0) -> tuple[dict, ImportReport]:
  """Load BERT weights from an HF dir / TF checkpoint as our param tree.

  `model_config`: our model config to load into; None derives it from the
  directory's config.json / bert_config.json. Returns (params as a nested
  dict of float32 numpy arrays, ImportReport).
  """
  if model_config is None:
    hf_cfg = read_hf_config(path)
    if hf_cfg is None:
      raise FileNotFoundError(f"No config.json or bert_config.json in {path}; "
                              "pass model_config.")
    model_config = model_config_from_hf_config(hf_cfg)
  sd, fmt = read_hf_state_dict(path)
  return from_hf_state_dict(sd, model_config, seed=seed, source=path, fmt=fmt)


# Files written by tools/convert_from_hf.py (our own format, no torch needed).
IMPORTED_PARAMS = "params.safetensors"
IMPORTED_CONFIG = "bert_jax_config.json"
IMPORT_REPORT = "import_report.json"


def save_imported(out_dir: str, params, model_config, report: ImportReport,
                  data_overrides: Mapping[str, Any] | None = None) -> None:
  """Write our param tree (flat dotted keys) + model config for init_from."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  flat = {k: _f32(v) for k, v in flatten_params(params).items()}
  save_file(flat, os.path.join(out_dir, IMPORTED_PARAMS),
            metadata={"format": "bert_jax"})
  with open(os.path.join(out_dir, IMPORTED_CONFIG), "w") as f:
    json.dump({"model": dict(model_config.to_dict()),
               "data": dict(data_overrides or {})}, f, indent=2)
  with open(os.path.join(out_dir, IMPORT_REPORT), "w") as f:
    json.dump(report.to_json(), f, indent=2)


def load_imported(path: str) -> tuple[dict, Any]:
  """Read a convert_from_hf.py directory -> (params, model config)."""
  import ml_collections
  from safetensors.numpy import load_file
  flat = load_file(os.path.join(path, IMPORTED_PARAMS))
  with open(os.path.join(path, IMPORTED_CONFIG)) as f:
    cfg = ml_collections.ConfigDict(json.load(f)["model"])
  return unflatten_params(flat), cfg


def load_init_params(path: str, model_config, *,
                     seed: int = 0) -> tuple[dict, ImportReport]:
  """What the trainer calls for `train.init_from`: a tools/convert_from_hf.py
  output, an HF dir, a Google TF checkpoint, or another bert_jax workdir
  (its latest checkpoint's params) -> (params for `model_config`, report).
  Params are a nested dict of float32 numpy arrays shaped like
  ``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` (int layer keys).

  Architecture fields of the source must equal `model_config` (a ValueError
  names the field otherwise); dropout/initializer/dtype come from
  `model_config`.
  """
  if os.path.isfile(os.path.join(path, IMPORTED_PARAMS)):
    params, src_cfg = load_imported(path)
    _check_same_architecture(src_cfg, model_config, path)
    report = ImportReport(source=path, format="bert_jax")
    report_path = os.path.join(path, IMPORT_REPORT)
    if os.path.isfile(report_path):
      with open(report_path) as f:
        report = ImportReport(**json.load(f))
      report.notes = list(report.notes) + [f"Read from {path}."]
    return params, report
  if os.path.isdir(os.path.join(path, "checkpoints")):  # Another bert_jax run.
    from bert_jax import checkpointing
    loaded = checkpointing.load_params(path)
    _check_same_architecture(loaded[1].model, model_config, path)
    return loaded[0], ImportReport(
        source=path, format="bert_jax", architecture="BertForPreTraining",
        loaded=sorted(flatten_params(loaded[0])))
  hf_cfg = read_hf_config(path)
  if hf_cfg is not None:
    _check_same_architecture(model_config_from_hf_config(hf_cfg),
                             model_config, path)
  return load_hf_params(path, model_config, seed=seed)


_ARCH_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
                "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size", "hidden_act",
                "layer_norm_eps")


def _check_same_architecture(src, dst, path) -> None:
  for f in _ARCH_FIELDS:
    if src[f] != dst[f]:
      raise ValueError(f"train.init_from={path} has model.{f}={src[f]}, but "
                       f"the config has model.{f}={dst[f]}; set "
                       f"--config.model.{f}={src[f]}.")


# --------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------
SPECIAL_TOKENS = dict(cls_token="[CLS]", sep_token="[SEP]",
                      mask_token="[MASK]", pad_token="[PAD]",
                      unk_token="[UNK]")


@dataclasses.dataclass
class TokenizerSpec:
  """Where a training run's tokenizer lives and how it was used."""
  kind: str  # "sentencepiece" or "wordpiece"
  path: str  # the .model file or vocab.txt
  lower_case: bool = True


def find_tokenizer(workdir: str, config) -> TokenizerSpec:
  """The tokenizer of a training run: data.tokenizer_path, else the one the
  trainer trained and cached under workdir/tokenizer/ (input_pipeline's
  ``<type>-<size>-<cased|uncased>-<hash>/spm.model|vocab.txt``)."""
  data = config.get("data", None) or {}
  kind = data.get("tokenizer_type", "sentencepiece") or "sentencepiece"
  lower = bool(data.get("lower_case", True))
  path = data.get("tokenizer_path", "") or ""
  if path:
    if not os.path.isabs(path) and not os.path.exists(path):
      path = os.path.join(workdir, path)
    if os.path.isfile(path):
      return TokenizerSpec(kind, path, lower)
    raise FileNotFoundError(f"data.tokenizer_path={path!r} does not exist.")
  pattern = "*.model" if kind == "sentencepiece" else "vocab.txt"
  root = os.path.join(workdir, "tokenizer")
  found = sorted(glob.glob(os.path.join(root, "**", pattern), recursive=True))
  if len(found) > 1:  # Prefer the one this config would have trained.
    name = (f"{kind}-{data.get('tokenizer_vocab_size', '')}-"
            f"{'uncased' if lower else 'cased'}-")
    matching = [f for f in found
                if os.path.basename(os.path.dirname(f)).startswith(name)]
    found = matching or found
    if len(found) > 1:
      found.sort(key=os.path.getmtime)
      logging.warning("Several tokenizers under %s; using the newest, %s.",
                      root, found[-1])
  if not found:
    raise FileNotFoundError(
        f"No tokenizer: data.tokenizer_path is empty and {root} holds no "
        f"{pattern}.")
  return TokenizerSpec(kind, found[-1], lower)


def _special_added_tokens(tokens):
  from tokenizers import AddedToken
  return [AddedToken(t, special=True, normalized=False) for t in tokens]


@functools.lru_cache(maxsize=1)
def _case_folds() -> dict[str, str]:
  """Characters that lower-casing leaves but full case folding changes."""
  folds = {}
  for cp in range(0x110000):
    c = chr(cp)
    if c.lower() == c and c.casefold() != c and not 0xD800 <= cp < 0xE000:
      folds[c] = c.casefold()
  return folds


def _wordpiece_tokenizer(vocab_path: str, lower_case: bool):
  from tokenizers import Tokenizer, decoders, models, normalizers
  from tokenizers import pre_tokenizers
  with open(vocab_path, encoding="utf-8") as f:
    vocab = {}
    for line in f:
      tok = line.rstrip("\n")
      if tok and tok not in vocab:
        vocab[tok] = len(vocab)
  for t in SPECIAL_TOKENS.values():
    if t not in vocab:
      raise ValueError(f"{vocab_path} lacks the special token {t}.")
  tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]",
                                   max_input_chars_per_word=100))
  bert = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=True, strip_accents=lower_case,
      lowercase=lower_case)
  # tf_text.FastBertTokenizer treats NUL as a separator; BERT's cleaner drops it.
  norms = [normalizers.Replace("\x00", " ")]
  if lower_case:
    # FastBertTokenizer(lower_case_nfd_strip_accents=True) applies ICU
    # NFKC case folding before stripping accents: compatibility forms
    # ("\ufb01" -> "fi", full-width digits), case folding ("\u00df" -> "ss",
    # final sigma -> sigma), and it drops default-ignorable Hangul fillers.
    norms += [normalizers.NFKD(), normalizers.Replace("\u0345", "\u03b9"),
              normalizers.Replace("\u115f", ""),
              normalizers.Replace("\u1160", ""), bert]
    norms += [normalizers.Replace(k, v) for k, v in _case_folds().items()]
  else:
    norms.append(bert)
  tok.normalizer = normalizers.Sequence(norms)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
  return tok, vocab


def _sentencepiece_tokenizer(model_path: str, lower_case: bool):
  """A `tokenizers` Unigram/BPE tokenizer equal to SentencePiece on plain text."""
  from sentencepiece import sentencepiece_model_pb2 as sp_pb2
  from tokenizers import Regex, Tokenizer, decoders, models, normalizers
  from tokenizers import pre_tokenizers
  proto = sp_pb2.ModelProto()
  with open(model_path, "rb") as f:
    proto.ParseFromString(f.read())
  # Piece types: 1 normal, 2 unknown, 3 control, 4 user defined, 6 byte.
  vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
  byte_fallback = proto.trainer_spec.byte_fallback
  model_type = proto.trainer_spec.model_type  # 1 unigram, 2 bpe
  # Control pieces never come out of SentencePiece for text: keep them out of
  # the Unigram search (they are matched as added special tokens instead).
  scores = [(p.piece, p.score if p.type in (1, 4, 6) else
             (-1e9 if p.type == 3 else p.score)) for p in proto.pieces]
  unk_id = proto.trainer_spec.unk_id
  if model_type == 1:
    tok = Tokenizer(models.Unigram(scores, unk_id=unk_id,
                                   byte_fallback=byte_fallback))
  elif model_type == 2:
    normal = {p.piece: (p.score, i) for i, p in enumerate(proto.pieces)
              if p.type == 1}
    ranked = sorted((-normal[a + b][0], normal[a + b][1], a, b)
                    for tokn in normal for a, b in
                    ((tokn[:k], tokn[k:]) for k in range(1, len(tokn)))
                    if a in normal and b in normal)
    tok = Tokenizer(models.BPE(vocab, [(a, b) for _, _, a, b in ranked],
                               unk_token=proto.pieces[unk_id].piece,
                               fuse_unk=True, byte_fallback=byte_fallback))
  else:
    raise ValueError(f"{model_path}: SentencePiece model_type {model_type} "
                     "is not supported (unigram or bpe only).")
  spec = proto.normalizer_spec
  # Lower-casing, if any, is part of the model's own normalizer
  # (nmt_nfkc_cf), which the precompiled charsmap carries: `lower_case` is
  # not applied on top.
  del lower_case
  norms = []
  if spec.precompiled_charsmap:
    norms.append(normalizers.Precompiled(spec.precompiled_charsmap))
  # The dummy prefix is added by Metaspace(prepend_scheme="first"): only at
  # the start of the text, not after a special token such as [MASK] (so
  # "about [MASK]." gives "_about [MASK] ." as the model saw in training).
  # "first" looks at the original offset, so leading spaces are collapsed to
  # one (which becomes the prefix) rather than deleted; Metaspace adds none
  # when the text already starts with "_", hence the doubling of a literal one.
  if spec.remove_extra_whitespaces:
    norms += [normalizers.Replace(Regex("\\A\u2581"), "\u2581\u2581"),
              normalizers.Replace(Regex(" +\\z"), ""),
              normalizers.Replace(Regex(" {2,}"), " ")]
  if spec.escape_whitespaces:
    norms.append(normalizers.Replace(" ", "\u2581"))
  if not spec.remove_extra_whitespaces and spec.add_dummy_prefix:
    norms.append(normalizers.Replace(Regex("\\A\u2581"), "\u2581\u2581"))
  tok.normalizer = normalizers.Sequence(norms)
  pre = []
  if spec.add_dummy_prefix:
    pre.append(pre_tokenizers.Metaspace(replacement="▁",
                                        prepend_scheme="first", split=False))
  user = [p.piece for p in proto.pieces if p.type == 4]
  if user:
    pattern = "|".join(re.escape(u) for u in sorted(user, key=len,
                                                    reverse=True))
    pre.append(pre_tokenizers.Split(Regex(pattern), behavior="isolated"))
  if pre:
    tok.pre_tokenizer = pre_tokenizers.Sequence(pre)
  decs = [decoders.Replace("▁", " ")]
  if byte_fallback:
    decs.append(decoders.ByteFallback())
  decs.append(decoders.Fuse())
  if spec.add_dummy_prefix:
    decs.append(decoders.Strip(content=" ", left=1))
  tok.decoder = decoders.Sequence(decs)
  return tok, vocab


def build_hf_tokenizer(spec: TokenizerSpec):
  """A `tokenizers.Tokenizer` matching the training tokenizer, with BERT's
  [CLS] A [SEP] (B [SEP]) template and the special tokens registered."""
  from tokenizers import processors
  if spec.kind == "wordpiece":
    tok, vocab = _wordpiece_tokenizer(spec.path, spec.lower_case)
  elif spec.kind == "sentencepiece":
    tok, vocab = _sentencepiece_tokenizer(spec.path, spec.lower_case)
  else:
    raise ValueError(f"data.tokenizer_type={spec.kind!r}: expected "
                     "'sentencepiece' or 'wordpiece'.")
  specials = [t for t in SPECIAL_TOKENS.values() if t in vocab]
  for t in ("[CLS]", "[SEP]", "[MASK]"):
    if t not in vocab:
      raise ValueError(f"Tokenizer {spec.path} has no {t} piece.")
  tok.add_special_tokens(_special_added_tokens(specials))
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
      special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
  return tok


def write_hf_tokenizer_files(out_dir: str, spec: TokenizerSpec, *,
                             model_max_length: int = 512) -> dict:
  """tokenizer.json + tokenizer_config.json (+ vocab.txt or the .model).

  Returns the tokenizer_config dict. AutoTokenizer.from_pretrained(out_dir)
  loads the result with no custom code.
  """
  tok = build_hf_tokenizer(spec)
  os.makedirs(out_dir, exist_ok=True)
  tok.save(os.path.join(out_dir, "tokenizer.json"))
  vocab = tok.get_vocab()
  specials = {k: v for k, v in SPECIAL_TOKENS.items() if v in vocab}
  if "[UNK]" not in vocab and spec.kind == "sentencepiece":
    from sentencepiece import sentencepiece_model_pb2 as sp_pb2
    proto = sp_pb2.ModelProto()
    with open(spec.path, "rb") as f:
      proto.ParseFromString(f.read())
    specials["unk_token"] = proto.pieces[proto.trainer_spec.unk_id].piece
  cfg = dict(specials, model_max_length=int(model_max_length),
             clean_up_tokenization_spaces=False,
             model_input_names=["input_ids", "token_type_ids",
                                "attention_mask"])
  if spec.kind == "wordpiece":
    shutil.copyfile(spec.path, os.path.join(out_dir, "vocab.txt"))
    # Not "BertTokenizer": transformers would rebuild its own normalizer
    # from vocab.txt and lose the tf_text-exact one in tokenizer.json.
    cfg.update(tokenizer_class="PreTrainedTokenizerFast",
               do_lower_case=spec.lower_case, strip_accents=None,
               tokenize_chinese_chars=True)
  else:
    shutil.copyfile(spec.path, os.path.join(out_dir, "spiece.model"))
    cfg.update(tokenizer_class="PreTrainedTokenizerFast",
               do_lower_case=spec.lower_case)
  with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
    json.dump(specials, f, indent=2)
  return cfg


@dataclasses.dataclass
class LoadedTokenizer:
  """A `tokenizers.Tokenizer` plus what fill-mask needs from the HF config."""
  tokenizer: Any
  mask_token: str = "[MASK]"
  pad_token: str = "[PAD]"
  clean_up_tokenization_spaces: bool = False

  @property
  def mask_token_id(self) -> int:
    return self.tokenizer.token_to_id(self.mask_token)

  @property
  def pad_token_id(self):
    return self.tokenizer.token_to_id(self.pad_token)


def load_hf_tokenizer(path: str) -> LoadedTokenizer:
  """Tokenizer of an HF directory: tokenizer.json, else vocab.txt (BERT)."""
  from tokenizers import Tokenizer
  cfg = {}
  cfg_path = os.path.join(path, "tokenizer_config.json")
  if os.path.isfile(cfg_path):
    with open(cfg_path) as f:
      cfg = json.load(f)

  def token_str(v, default):
    if isinstance(v, dict):
      return v.get("content", default)
    return v or default

  mask = token_str(cfg.get("mask_token"), "[MASK]")
  pad = token_str(cfg.get("pad_token"), "[PAD]")
  cleanup = bool(cfg.get("clean_up_tokenization_spaces", False))
  tj = os.path.join(path, "tokenizer.json")
  if os.path.isfile(tj):
    tok = Tokenizer.from_file(tj)
  elif os.path.isfile(os.path.join(path, "vocab.txt")):
    tok = build_hf_tokenizer(TokenizerSpec(
        "wordpiece", os.path.join(path, "vocab.txt"),
        bool(cfg.get("do_lower_case", True))))
  else:
    raise FileNotFoundError(f"No tokenizer.json or vocab.txt in {path}.")
  return LoadedTokenizer(tok, mask, pad, cleanup)


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------

def save_hf_model(out_dir: str, params, model_config, *,
                  tokenizer: TokenizerSpec | None = None,
                  nsp_trained: bool = True,
                  source: str = "") -> list[str]:
  """Write an HF BertForPreTraining directory; returns the files written.

  config.json + model.safetensors (float32, tied decoder written explicitly)
  + tokenizer files. With `nsp_trained=False` the pooler and NSP head are
  flagged: a warning, a note file, and a key in config.json.
  """
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  sd = to_hf_state_dict(params)
  if int(sd["bert.embeddings.word_embeddings.weight"].shape[0]) != int(
      model_config.vocab_size):
    raise ValueError("params do not match model.vocab_size.")
  save_file(sd, os.path.join(out_dir, "model.safetensors"),
            metadata={"format": "pt"})
  written = ["model.safetensors"]
  pad_id = 0
  if tokenizer is not None:
    cfg = write_hf_tokenizer_files(
        out_dir, tokenizer,
        model_max_length=int(model_config.max_position_embeddings))
    written += ["tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json",
                "vocab.txt" if tokenizer.kind == "wordpiece" else
                "spiece.model"]
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    pad = tok.token_to_id(cfg.get("pad_token", "[PAD]"))
    pad_id = 0 if pad is None else pad
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    if n_tok > int(model_config.vocab_size):
      raise ValueError(f"The tokenizer has {n_tok} tokens but "
                       f"model.vocab_size={model_config.vocab_size}.")
  extra = {"bert_jax_source": source} if source else {}
  untrained = [] if nsp_trained else ["bert.pooler", "cls.seq_relationship"]
  if untrained:
    extra["bert_jax_untrained_heads"] = untrained
    msg = ("This run trained without next-sentence prediction "
           "(data.nsp=False): the exported pooler (bert.pooler) and NSP head "
           "(cls.seq_relationship) are untrained random weights. Do not use "
           "pooler_output or NSP logits; fine-tune them first.")
    logging.warning(msg)
    with open(os.path.join(out_dir, UNTRAINED_HEADS_NOTE), "w") as f:
      f.write("# Untrained heads\n\n" + msg + "\n")
    written.append(UNTRAINED_HEADS_NOTE)
  cfg = hf_config_from_model_config(model_config, pad_token_id=pad_id,
                                    extra=extra)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  written.insert(0, "config.json")
  return written
