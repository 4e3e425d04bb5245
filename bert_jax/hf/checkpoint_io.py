"""Hugging Face and Google checkpoint files: read, write, configs.

Reads weights from safetensors (single or sharded), ``pytorch_model.bin``
(torch imported only then) or a Google TF checkpoint (TensorFlow imported only
then); writes an HF directory (config.json + model.safetensors + tokenizer
files) and our imported-directory format (tools/convert_from_hf.py output).
Names are translated by ``hf.mapping``; tokenizer files by
``hf.tokenizer_files``.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from typing import Any, Mapping, NamedTuple

import jax.numpy as jnp
import ml_collections
import numpy as np
from safetensors import numpy as safetensors_numpy
from safetensors import safe_open
from safetensors.numpy import load_file

from bert_jax.hf import importing
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files
from bert_jax.hf import vocab

# Fields that fix the parameter shapes and the function computed: a source and
# the config it is loaded into must agree on them.
ARCH_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers",
               "num_attention_heads", "intermediate_size",
               "max_position_embeddings", "type_vocab_size", "hidden_act",
               "layer_norm_eps", "positions_from_pad", "pad_token_id")

UNTRAINED_HEADS_NOTE = "UNTRAINED_HEADS.md"
# config.json special-token ids (ModernBertConfig's) -> the
# tokenizer_config.json entry naming the token: [CLS] opens and [SEP] ends.
_SPECIAL_ID_TOKENS = (("cls_token_id", "cls_token"),
                      ("bos_token_id", "cls_token"),
                      ("sep_token_id", "sep_token"),
                      ("eos_token_id", "sep_token"))

# Files written by tools/convert_from_hf.py (our own format, no torch needed).
IMPORTED_PARAMS = "params.safetensors"
IMPORTED_CONFIG = "bert_jax_config.json"
IMPORT_REPORT = "import_report.json"
# Weight files that make a directory a Hugging Face checkpoint.
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json",
                   "pytorch_model.bin")


# --------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------
def check_same_architecture(src, dst, path: str,
                            field: str = "train.init_from",
                            note: str = "") -> None:
  """ValueError naming the first ARCH_FIELDS entry where src (the model at
  `path`, given as config `field`) and dst differ; `note` says what the
  config's model is, when that is not obvious."""
  for f in ARCH_FIELDS:
    if src[f] != dst[f]:
      raise ValueError(f"{field}: {path} has model.{f}={src[f]}, but the "
                       f"config has model.{f}={dst[f]}{note}; set "
                       f"--config.model.{f}={src[f]}.")


def read_hf_config(path: str) -> dict | None:
  """config.json (HF) or bert_config.json (Google) next to the weights."""
  base = path if os.path.isdir(path) else os.path.dirname(path)
  for name in ("config.json", "bert_config.json"):
    p = os.path.join(base, name)
    if os.path.isfile(p):
      with open(p) as f:
        return json.load(f)
  return None


# --------------------------------------------------------------------------
# Reading weights
# --------------------------------------------------------------------------
def find_tf_checkpoint(path: str) -> str | None:
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
  try:
    return load_file(path)
  except TypeError:  # bfloat16: read through JAX, which has the dtype.
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
  prefix = find_tf_checkpoint(path)
  if prefix is not None:
    import tensorflow as tf  # Lazy: only Google's TF checkpoints need it.
    reader = tf.train.load_checkpoint(prefix)
    names = reader.get_variable_to_shape_map()
    state = importing.TF_TRAINING_STATE
    sd = {n: reader.get_tensor(n) for n in sorted(names)
          if not state.search(n)}
    sd.update({n: np.zeros(()) for n in names if state.search(n)})
    return sd, "tf_checkpoint"
  raise FileNotFoundError(
      f"No model.safetensors, pytorch_model.bin or TF checkpoint in {path}.")


def load_hf_params(path: str, model_config, table: mapping.Table, *,
                   seed: int = 0) -> tuple[dict, importing.ImportReport]:
  """Load weights from an HF dir / TF checkpoint as our param tree of
  `table` for `model_config` -> (params as a nested dict of float32 numpy
  arrays, ImportReport)."""
  sd, fmt = read_hf_state_dict(path)
  return importing.from_hf_state_dict(sd, model_config, table, seed=seed,
                                      source=path, fmt=fmt)


def write_safetensors(path: str, tensors, metadata) -> None:
  """A safetensors file created like every other file we write (mode 0666
  less the umask: 0644 by default). safetensors' own save_file creates it
  0600, so nobody else on the machine could load an export."""
  with open(path, "wb") as f:
    f.write(safetensors_numpy.save(tensors, metadata=metadata))


# --------------------------------------------------------------------------
# Our imported-directory format (tools/convert_from_hf.py)
# --------------------------------------------------------------------------
def save_imported(out_dir: str, params, model_config,
                  report: importing.ImportReport,
                  data_overrides: Mapping[str, Any] | None = None,
                  objective: Mapping[str, Any] | None = None) -> None:
  """Write our param tree (flat dotted keys) + model config for init_from;
  `objective`: the objective group of the source (which objective's params
  these are; directories without one hold BERT's)."""
  os.makedirs(out_dir, exist_ok=True)
  flat = {k: mapping.f32(v) for k, v in mapping.flatten_params(params).items()}
  write_safetensors(os.path.join(out_dir, IMPORTED_PARAMS), flat,
                    {"format": "bert_jax"})
  stored = {"model": dict(model_config.to_dict()),
            "data": dict(data_overrides or {})}
  if objective is not None:
    stored["objective"] = dict(objective)
  with open(os.path.join(out_dir, IMPORTED_CONFIG), "w") as f:
    json.dump(stored, f, indent=2)
  with open(os.path.join(out_dir, IMPORT_REPORT), "w") as f:
    json.dump(report.to_json(), f, indent=2)


def read_imported_config(path: str) -> dict:
  """{"model": ..., "data": ...[, "objective": ...]} of an imported
  directory (``config_lib.complete`` gives the default objective to those
  without one)."""
  with open(os.path.join(path, IMPORTED_CONFIG)) as f:
    return json.load(f)


def load_imported(path: str) -> tuple[dict, Any, importing.ImportReport]:
  """Read a convert_from_hf.py directory -> (params, model config, report)."""
  flat = load_file(os.path.join(path, IMPORTED_PARAMS))
  cfg = ml_collections.ConfigDict(read_imported_config(path)["model"])
  report = importing.ImportReport(source=path, format="bert_jax")
  report_path = os.path.join(path, IMPORT_REPORT)
  if os.path.isfile(report_path):
    with open(report_path) as f:
      report = importing.ImportReport(**json.load(f))
    report.notes = list(report.notes) + [f"Read from {path}."]
  return mapping.unflatten_params(flat), cfg, report


# --------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------
class HFModel(NamedTuple):
  """One Hugging Face model directory of an export (``bert_jax.compose``
  says which a run holds; ``bert_jax.export`` writes each with
  :func:`save_hf_model`)."""
  subdir: str  # under the export directory; "" = the directory itself
  table: mapping.Table  # names, config.json, architecture
  model_config: Any  # our model config of this model
  params: Any  # its param tree (the family's layout)


def save_hf_model(out_dir: str, params, model_config, *,
                  tokenizer: tokenizer_files.TokenizerSpec | None = None,
                  untrained_heads: tuple[str, ...] = (),
                  table: mapping.Table,
                  source: str = "",
                  label_names=()) -> list[str]:
  """Write an HF directory of the table's class; returns the files written.

  config.json (the table's config conversion, plus its own fields, e.g.
  id2label from `label_names` for classification) + model.safetensors
  (float32, tied weights written explicitly) + tokenizer files, the pad id
  read from the tokenizer. With a tokenizer smaller than the table, the
  rows past it (padding, no token) are left out and config.json's
  vocab_size is the tokenizer's (``hf.vocab``). `untrained_heads` (HF
  prefixes) are flagged: a warning, a note file, and a key in config.json.
  The checks (params vs model.vocab_size, tokenizer vs vocab_size) run
  before anything is written.
  """
  fam = table
  if vocab.rows(params) != int(model_config.vocab_size):
    raise ValueError(f"The params have {vocab.rows(params)} vocabulary rows "
                     f"but model.vocab_size={model_config.vocab_size}.")
  pad_id, tok = 0, None
  if tokenizer is not None:
    tok = tokenizer_files.build_hf_tokenizer(tokenizer)
    n_tok = tok.get_vocab_size(with_added_tokens=True)
    if n_tok > int(model_config.vocab_size):
      raise ValueError(f"The tokenizer has {n_tok} tokens but "
                       f"model.vocab_size={model_config.vocab_size}.")
    if n_tok < int(model_config.vocab_size):  # Padded rows: no token.
      logging.info("Vocabulary: the tokenizer has %d tokens; the %d rows of "
                   "the table past them are left out (config.json "
                   "vocab_size=%d).", n_tok,
                   int(model_config.vocab_size) - n_tok, n_tok)
      params = vocab.trim(params, n_tok)
      model_config = ml_collections.ConfigDict(model_config.to_dict())
      model_config.vocab_size = n_tok
    pad = tok.token_to_id(tokenizer_files.special_token_names(
        tokenizer).get("pad_token", ""))
    pad_id = 0 if pad is None else pad
  sd = mapping.to_hf_state_dict(params, table)
  os.makedirs(out_dir, exist_ok=True)
  write_safetensors(os.path.join(out_dir, "model.safetensors"), sd,
                    {"format": "pt"})
  written = ["config.json", "model.safetensors"]
  tok_cfg = {}
  if tok is not None:
    tok_cfg = tokenizer_files.write_hf_tokenizer_files(
        out_dir, tokenizer, tokenizer=tok,
        model_max_length=int(model_config.max_position_embeddings))
    written += ["tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json"]
    written += {"wordpiece": ["vocab.txt"], "sentencepiece": [
        "spiece.model"]}.get(tokenizer.kind, [])
  extra = dict(fam.config_fields(model_config, tuple(label_names))
               ) if fam.config_fields else {}
  if source:
    extra["bert_jax_source"] = source
  if untrained_heads:
    extra["bert_jax_untrained_heads"] = list(untrained_heads)
    msg = ("This run did not train " + " and ".join(untrained_heads) +
           " (e.g. data.nsp=False: no next-sentence prediction): they are "
           "untrained random weights. Do not use their outputs (e.g. "
           "pooler_output or NSP logits); fine-tune them first.")
    logging.warning(msg)
    with open(os.path.join(out_dir, UNTRAINED_HEADS_NOTE), "w") as f:
      f.write("# Untrained heads\n\n" + msg + "\n")
    written.append(UNTRAINED_HEADS_NOTE)
  cfg = dict(fam.config_to_hf(model_config, pad_id), **extra)
  if tokenizer is not None:  # Families whose config names more special ids.
    for key, token in _SPECIAL_ID_TOKENS:
      tok_id = tok.token_to_id(tok_cfg.get(token, ""))
      if key in cfg and tok_id is not None:
        cfg[key] = int(tok_id)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  return written
