"""Export a training checkpoint as a Hugging Face directory.

BertForPreTraining for BERT runs; the run's objective picks another family
(objective.name=albert: AlbertForPreTraining; distil: the student as
DistilBertForMaskedLM).

  python tools/convert_to_hf.py WORKDIR OUT [--step N]
  python tools/convert_to_hf.py --workdir WORKDIR --output OUT [--step N]

The class follows the run's objective (config.objective.name, through
``hf.mapping.for_objective``): a pretraining run becomes
BertForPreTraining, a fine-tuning run (``bert_jax.finetune``) becomes
BertForSequenceClassification with the run's id2label / label2id
(problem_type "regression" for one output). Writes OUT/config.json,
OUT/model.safetensors (float32, whatever the compute dtype; BERT's tied MLM
decoder written explicitly) and tokenizer files that
transformers.AutoTokenizer loads with no custom code. Reads the checkpoint
with no mesh and no TensorFlow. Then, in PyTorch:

  from transformers import pipeline
  pipeline("fill-mask", model=OUT)("Paris is the [MASK] of France.")
  pipeline("text-classification", model=OUT)("a great movie")  # fine-tuned

An ELECTRA run becomes a pair: OUT/discriminator (ElectraForPreTraining)
and OUT/generator (ElectraForMaskedLM), see bert_jax/hf/electra.py.
If a pretraining run trained without NSP (data.nsp=False), the pooler and
NSP head are untrained: a warning is logged and OUT/UNTRAINED_HEADS.md says
so.
"""

import argparse
import logging
import os
import sys

from bert_jax import export


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
  return export.export_run(workdir, output, step)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("paths", nargs="*", metavar="PATH",
                      help="WORKDIR OUT (or use --workdir, --output).")
  parser.add_argument("--workdir", default=None)
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step (default: latest).")
  parser.add_argument("--output", default=None)
  parser.add_argument("--verbose", action="store_true",
                      help="Also print the libraries' INFO lines (Orbax's "
                      "restore steps, JAX's backend probing).")
  args = parser.parse_args(argv)
  positional = list(args.paths)
  args.workdir = args.workdir or (positional.pop(0) if positional else None)
  args.output = args.output or (positional.pop(0) if positional else None)
  if not args.workdir or not args.output or positional:
    parser.error("give WORKDIR and OUT (positionally or as --workdir, "
                 "--output), once each.")
  # Warnings (an untrained head, a damaged step) and errors only: Orbax logs
  # 11 INFO lines per restore that say nothing about the export.
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                      format="%(levelname)s %(message)s", force=True)
  try:
    written = convert(args.workdir, args.output, args.step)
  except (ValueError, OSError) as e:  # A wrong path or step: one sentence.
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"Wrote {args.output}: {', '.join(written)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
