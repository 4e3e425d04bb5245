"""Import BERT weights from Hugging Face or Google TF into bert_jax.

  python tools/convert_from_hf.py --model HF_DIR --output DIR

HF_DIR: a transformers BertForPreTraining / BertForMaskedLM / BertModel
directory (model.safetensors, sharded safetensors or pytorch_model.bin, with
config.json), or a Google BERT checkpoint directory (bert_config.json +
bert_model.ckpt.*; optimizer slots and global_step are skipped). Heads absent
from the source (pooler, MLM, NSP) are initialized fresh and listed.

DIR gets params.safetensors (our parameter tree, float32), bert_jax_config.json
(the model config, and data settings for its tokenizer), import_report.json
and the tokenizer files. Start pretraining from it with
  python -m bert_jax.main --config configs/base.py --workdir W \
      --config.train.init_from=DIR
(the model fields of the config must match the imported ones), or fill masks:
  python -m bert_jax.fill_mask --model DIR "Paris is the [MASK] of France."
"""

import argparse
import json
import os
import shutil
import sys

from bert_jax import pretrained
from bert_jax.hf import checkpoint_io
from bert_jax.hf import importing

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json",
                    "special_tokens_map.json", "vocab.txt", "spiece.model")


def _expected(model: str) -> str:
  found = sorted(os.listdir(model))[:5] if os.path.isdir(model) else []
  return (f"--model={model} is not a Hugging Face BERT directory "
          "(config.json with model.safetensors, sharded safetensors or "
          "pytorch_model.bin) nor a Google TF checkpoint directory "
          "(bert_config.json + bert_model.ckpt.index); it holds "
          f"{', '.join(found) if found else 'nothing'}.")


def convert(model: str, output: str, seed: int = 0) -> importing.ImportReport:
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
  for name in _TOKENIZER_FILES:
    if os.path.isfile(os.path.join(src, name)):
      shutil.copyfile(os.path.join(src, name), os.path.join(output, name))
  data = {}
  tok_cfg = {}
  if os.path.isfile(os.path.join(src, "tokenizer_config.json")):
    with open(os.path.join(src, "tokenizer_config.json")) as f:
      tok_cfg = json.load(f)
  if os.path.isfile(os.path.join(output, "vocab.txt")):
    data = dict(tokenizer_type="wordpiece",
                tokenizer_path=os.path.abspath(
                    os.path.join(output, "vocab.txt")),
                lower_case=bool(tok_cfg.get("do_lower_case", True)))
  elif os.path.isfile(os.path.join(output, "spiece.model")):
    data = dict(tokenizer_type="sentencepiece",
                tokenizer_path=os.path.abspath(
                    os.path.join(output, "spiece.model")))
  checkpoint_io.save_imported(output, params, model_config, report,
                              data_overrides=data,
                              objective=source.config.objective.to_dict())
  return report


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", required=True,
                      help="HF directory or Google TF checkpoint directory.")
  parser.add_argument("--output", required=True)
  parser.add_argument("--seed", type=int, default=0,
                      help="Seed for heads initialized fresh.")
  args = parser.parse_args(argv)
  try:
    report = convert(args.model, args.output, args.seed)
  except (ValueError, OSError) as e:  # A wrong directory: one sentence.
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(report.summary())
  print(f"Wrote {args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
