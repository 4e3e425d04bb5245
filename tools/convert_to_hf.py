"""Export a training checkpoint as a Hugging Face directory.

BertForPreTraining for BERT runs; the run's objective picks another family
(objective.name=albert: AlbertForPreTraining; distil: the student as
DistilBertForMaskedLM).

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

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax import pretrained
from bert_jax.hf import checkpoint_io


def convert(workdir: str, output: str, step: int | None = None) -> list[str]:
  source = pretrained.resolve(workdir, step)
  model_config = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, model_config)
  family, untrained = "bert", pretrained.untrained_heads(source.config)
  if source.config is not None and "objective" in source.config:
    objective = objectives.get(source.config.objective.name)
    if objective.hf_export is not None:
      family, model_config = objective.hf_export(
          config_lib.complete(source.config))
      untrained = ()
  return checkpoint_io.save_hf_model(
      output, params, model_config, tokenizer=pretrained.tokenizer_spec(source),
      untrained_heads=untrained, family=family,
      source=f"{source.workdir or source.path} step {source.step}")


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
