"""Fill in [MASK] tokens with a pretrained model: the zero-shot check of BERT.

  python -m bert_jax.fill_mask --model WORKDIR_OR_HF_DIR [--top_k 5] [--json] \
      "Elephants are playing in the zoo with monkeys. The story is about [MASK]."

--model is a training workdir (latest checkpoint, or --step; an ELECTRA
run fills with its generator), an ELECTRA export (discriminator/ +
generator/), a Hugging Face BERT, ALBERT, DistilBERT or ModernBERT
directory (ours from tools/convert_to_hf.py, or anyone's), a Google TF
checkpoint directory, or a tools/convert_from_hf.py output. The model runs in
JAX (float32); tokenization uses the `tokenizers` library with the same
tokenizer.json an export writes, so no TensorFlow and no torch are imported.
The result has the shape of transformers' pipeline("fill-mask") output:
a list of {score, token, token_str, sequence} per mask (a list of such lists
when the text has several masks).
"""

import json
import sys
from typing import Any

from absl import flags

from bert_jax import cli
from bert_jax.downstream import mask_filling


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("Training workdir, HF directory, or converted dir.",
                   flag_values=flag_values)
  cli.define_step(flag_values=flag_values)
  flags.DEFINE_integer("top_k", 5, "Predictions per [MASK].",
                       flag_values=flag_values)
  flags.DEFINE_bool("json", False, "Print the HF pipeline-shaped list as "
                    "JSON.", flag_values=flag_values)


def main(argv: list[str] | None = None) -> int:
  args, texts = cli.parse(argv, define_flags, __doc__, positional=True)
  if not texts:
    print("error: give the text with [MASK] tokens after the flags.",
          file=sys.stderr)
    return 1
  try:
    runner = mask_filling.FillMask(*mask_filling.load(args.model, args.step))
    outputs: list[Any] = [runner(t, args.top_k) for t in texts]
  except (ValueError, OSError) as e:  # A wrong --model or text: one line.
    print(f"error: {e}", file=sys.stderr)
    return 1
  if args.json:
    print(json.dumps(outputs[0] if len(outputs) == 1 else outputs))
  else:
    for t, out in zip(texts, outputs):
      print(t)
      print(mask_filling.format_result(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
