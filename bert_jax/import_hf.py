"""Import a Hugging Face directory or a Google TF checkpoint as a directory
that training starts from (`train.init_from`) and every command reads.

The source is resolved by ``pretrained`` (its family and architecture from
its config), its params read into our tree by the family's table (heads it
lacks initialized fresh and listed), and written by
``checkpoint_io.save_imported``: ``params.safetensors`` (float32),
``bert_jax_config.json`` (the model config, the objective, and the data
settings its tokenizer needs), ``import_report.json``, and the source's
tokenizer files, copied. No TensorFlow unless the source is a TF checkpoint.

  from bert_jax import import_hf
  import_hf.import_checkpoint(HF_DIR, OUT)     # or python -m bert_jax.from_hf
"""

from __future__ import annotations

import json
import os
import shutil

from bert_jax import pretrained
from bert_jax.hf import checkpoint_io
from bert_jax.hf import importing

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.txt", "spiece.model")


def _expected(model: str) -> str:
  found = sorted(os.listdir(model))[:5] if os.path.isdir(model) else []
  return (f"--model={model} is not a Hugging Face BERT directory "
          "(config.json with model.safetensors, sharded safetensors or "
          "pytorch_model.bin) nor a Google TF checkpoint directory "
          "(bert_config.json + bert_model.ckpt.index); it holds "
          f"{', '.join(found) if found else 'nothing'}.")


def _tokenizer_settings(output: str, source_dir: str) -> dict:
  """The data fields that load the tokenizer files copied into `output`."""
  tok_cfg = {}
  if os.path.isfile(os.path.join(source_dir, "tokenizer_config.json")):
    with open(os.path.join(source_dir, "tokenizer_config.json")) as f:
      tok_cfg = json.load(f)
  if os.path.isfile(os.path.join(output, "vocab.txt")):
    return dict(tokenizer_type="wordpiece",
                tokenizer_path=os.path.abspath(
                    os.path.join(output, "vocab.txt")),
                lower_case=bool(tok_cfg.get("do_lower_case", True)))
  if os.path.isfile(os.path.join(output, "spiece.model")):
    return dict(tokenizer_type="sentencepiece",
                tokenizer_path=os.path.abspath(
                    os.path.join(output, "spiece.model")))
  return {}


def import_checkpoint(model: str, output: str,
                      seed: int = 0) -> importing.ImportReport:
  """Writes `output` from the Hugging Face directory or TF checkpoint at
  `model` (`seed`: of the heads initialized fresh); returns the report.
  Nothing is written when `model` is not such a source."""
  try:
    source = pretrained.resolve(model)
  except FileNotFoundError as e:
    if not os.path.isdir(model):
      raise
    raise FileNotFoundError(_expected(model)) from e
  if source.kind not in (pretrained.HF, pretrained.TF):
    raise ValueError(f"--model={model} is a {source.kind} source, not a "
                     "Hugging Face directory or TF checkpoint; it needs no "
                     "import (use it as train.init_from directly).")
  model_config = pretrained.load_model_config(source)
  params, report = pretrained.load_params(source, model_config, seed=seed)
  src = source.path if os.path.isdir(source.path) else os.path.dirname(
      source.path)
  os.makedirs(output, exist_ok=True)
  for name in TOKENIZER_FILES:
    if os.path.isfile(os.path.join(src, name)):
      shutil.copyfile(os.path.join(src, name), os.path.join(output, name))
  checkpoint_io.save_imported(output, params, model_config, report,
                              data_overrides=_tokenizer_settings(output, src),
                              objective=source.config.objective.to_dict())
  return report
