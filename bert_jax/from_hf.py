"""Import BERT weights from Hugging Face or Google TF into bert_jax.

  python -m bert_jax.from_hf --model HF_DIR --output DIR [--seed 0]

HF_DIR: a transformers BertForPreTraining / BertForMaskedLM / BertModel
directory (model.safetensors, sharded safetensors or pytorch_model.bin, with
config.json), or a Google BERT checkpoint directory (bert_config.json +
bert_model.ckpt.*; optimizer slots and global_step are skipped). Heads absent
from the source (pooler, MLM, NSP) are initialized fresh and listed.

DIR gets params.safetensors (our parameter tree, float32),
bert_jax_config.json (the model config, and data settings for its
tokenizer), import_report.json and the tokenizer files
(`bert_jax.import_hf.import_checkpoint`). Start pretraining from it with
  python -m bert_jax.main --config configs/base.py --workdir W \
      --config.train.init_from=DIR
(the model fields of the config must match the imported ones), or fill masks:
  python -m bert_jax.fill_mask --model DIR "Paris is the [MASK] of France."
"""

import sys

from absl import flags

from bert_jax import cli
from bert_jax import import_hf


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("HF directory or Google TF checkpoint directory.",
                   flag_values=flag_values)
  cli.define_output("The imported directory.", flag_values=flag_values)
  flags.DEFINE_integer("seed", 0, "Seed for heads initialized fresh.",
                       flag_values=flag_values)


def main(argv: list[str] | None = None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  try:
    report = import_hf.import_checkpoint(args.model, args.output, args.seed)
  except (ValueError, OSError) as e:  # A wrong directory: one sentence.
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(report.summary())
  print(f"Wrote {args.output}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
