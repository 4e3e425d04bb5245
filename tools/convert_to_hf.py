"""Export a training checkpoint as a Hugging Face BertForPreTraining directory.

  python tools/convert_to_hf.py --workdir DIR [--step N] --output OUT

Writes OUT/config.json, OUT/model.safetensors (float32, whatever the compute
dtype; the tied MLM decoder written explicitly) and tokenizer files that
transformers.AutoTokenizer loads with no custom code. Reads the checkpoint
with no mesh and no TensorFlow. Then, in PyTorch:

  from transformers import BertForPreTraining, pipeline
  model = BertForPreTraining.from_pretrained(OUT)
  pipeline("fill-mask", model=OUT)("Paris is the [MASK] of France.")

If the run trained without NSP (data.nsp=False), the pooler and NSP head are
untrained: a warning is logged and OUT/UNTRAINED_HEADS.md says so.
"""

import argparse
import logging
import os
import sys

from bert_jax import hf


def nsp_trained(config) -> bool:
  """Whether the run trained the pooler + sentence-pair head."""
  data = config.get("data", None)
  if data is None:
    return True
  objective = data.get("objective", "") or ""
  if objective:
    return objective in ("nsp", "sop")
  return bool(data.get("nsp", True))


def convert(workdir: str, output: str, step: int | None = None) -> list[str]:
  from bert_jax import checkpointing  # pylint: disable=g-import-not-at-top
  loaded = checkpointing.load_params(workdir, step)
  params, config = loaded[0], loaded[1]
  step = loaded[2] if len(loaded) > 2 else step
  spec = hf.find_tokenizer(workdir, config)
  written = hf.save_hf_model(
      output, params, config.model, tokenizer=spec,
      nsp_trained=nsp_trained(config),
      source=f"{os.path.abspath(workdir)} step {step}")
  return written


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step (default: latest).")
  parser.add_argument("--output", required=True)
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  written = convert(args.workdir, args.output, args.step)
  print(f"Wrote {args.output}: {', '.join(written)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
