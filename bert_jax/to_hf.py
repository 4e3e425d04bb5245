"""Export a run or checkpoint as Hugging Face directories.

  python -m bert_jax.to_hf --workdir WORKDIR --output OUT [--step N]
  python -m bert_jax.to_hf WORKDIR OUT [--step N]

WORKDIR: a training or fine-tuning workdir (its latest checkpoint, or
--step) or a checkpoint step directory. The class follows the run's
config (``compose.hf_models``): a BERT pretraining run becomes
BertForPreTraining, ALBERT AlbertForPreTraining, DistilBERT its student as
DistilBertForMaskedLM, ModernBERT ModernBertForMaskedLM, an ELECTRA run the
pair OUT/discriminator (ElectraForPreTraining) and OUT/generator
(ElectraForMaskedLM); a fine-tuning run (``bert_jax.finetune``) its
family's ...ForSequenceClassification (with the run's id2label /
label2id; problem_type "regression" for one output),
...ForTokenClassification or ...ForQuestionAnswering. Writes
OUT/config.json, OUT/model.safetensors (float32, whatever the compute dtype;
BERT's tied MLM decoder written explicitly) and tokenizer files that
transformers.AutoTokenizer loads with no custom code
(`bert_jax.export.export_run`). Reads the checkpoint with no mesh and no
TensorFlow. Then, in PyTorch:

  from transformers import pipeline
  pipeline("fill-mask", model=OUT)("Paris is the [MASK] of France.")
  pipeline("text-classification", model=OUT)("a great movie")  # fine-tuned

If a pretraining run trained without NSP (data.nsp=False), the pooler and
NSP head are untrained: a warning is logged and OUT/UNTRAINED_HEADS.md says
so.
"""

import logging
import os
import sys

from bert_jax import cli
from bert_jax import export


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_workdir("The run (or a checkpoint step directory) to export; "
                     "or give it first of the positional WORKDIR OUT.",
                     flag_values=flag_values, required=False)
  cli.define_step(flag_values=flag_values)
  cli.define_output("The Hugging Face directory to write (or OUT, "
                    "positionally).", flag_values=flag_values, required=False)
  cli.define_verbose(flag_values=flag_values)


def _no_checkpoint_yet(workdir: str) -> bool:
  """An existing directory with no committed checkpoints/<step>/state."""
  if "://" in workdir or not os.path.isdir(workdir):
    return False
  ckpts = os.path.join(workdir, "checkpoints")
  return not (os.path.isdir(ckpts) and any(
      d.isdigit() and os.path.isdir(os.path.join(ckpts, d, "state"))
      for d in os.listdir(ckpts)))


def export_workdir(workdir: str, output: str,
                   step: int | None = None) -> list[str]:
  """`export.export_run`, refusing first a workdir that saved nothing."""
  if step is None and _no_checkpoint_yet(workdir):
    raise FileNotFoundError(
        f"--workdir={workdir} has no checkpoint yet (no committed "
        "checkpoints/<step>/): train until the first save "
        "(checkpoint.save_every_steps) or pass the workdir of a run that "
        "saved one.")
  return export.export_run(workdir, output, step)


def main(argv: list[str] | None = None) -> int:
  args, paths = cli.parse(argv, define_flags, __doc__, positional=True)
  workdir = args.workdir or (paths.pop(0) if paths else None)
  output = args.output or (paths.pop(0) if paths else None)
  if not workdir or not output or paths:
    print("error: give WORKDIR and OUT (positionally or as --workdir, "
          "--output), once each.", file=sys.stderr)
    return 1
  # Warnings (an untrained head, a damaged step) and errors only: Orbax logs
  # 11 INFO lines per restore that say nothing about the export.
  logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                      format="%(levelname)s %(message)s", force=True)
  try:
    written = export_workdir(workdir, output, args.step)
  except (ValueError, OSError) as e:  # A wrong path or step: one sentence.
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"Wrote {output}: {', '.join(written)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
