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

from bert_jax import pretrained
from bert_jax.hf import checkpoint_io


def _no_checkpoint_yet(workdir: str) -> bool:
  """An existing directory with no committed checkpoints/<step>/state."""
  if "://" in workdir or not os.path.isdir(workdir):
    return False
  ckpts = os.path.join(workdir, "checkpoints")
  return not (os.path.isdir(ckpts) and any(
      d.isdigit() and os.path.isdir(os.path.join(ckpts, d, "state"))
      for d in os.listdir(ckpts)))


def convert(workdir: str, output: str, step: int | None = None) -> list[str]:
  if step is None and _no_checkpoint_yet(workdir):
    raise FileNotFoundError(
        f"--workdir={workdir} has no checkpoint yet (no committed "
        "checkpoints/<step>/): train until the first save "
        "(checkpoint.save_every_steps) or pass the workdir of a run that "
        "saved one.")
  source = pretrained.resolve(workdir, step)
  model_config = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, model_config)
  return checkpoint_io.save_hf_model(
      output, params, model_config, tokenizer=pretrained.tokenizer_spec(source),
      untrained_heads=pretrained.untrained_heads(source.config),
      source=f"{source.workdir or source.path} step {source.step}")


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step (default: latest).")
  parser.add_argument("--output", required=True)
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
  try:
    written = convert(args.workdir, args.output, args.step)
  except (ValueError, OSError) as e:  # A wrong path or step: one sentence.
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"Wrote {args.output}: {', '.join(written)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
