"""Fill in [MASK] tokens with a pretrained model: the zero-shot check of BERT.

  python -m bert_jax.fill_mask --model WORKDIR_OR_HF_DIR [--top_k 5] [--json] \
      "Elephants are playing in the zoo with monkeys. The story is about [MASK]."
  # A file of texts, one per line -> one JSON result per line, streamed:
  python -m bert_jax.fill_mask --model M --input texts.txt --output out.jsonl \
      [--batch_size 8 --seq_length 128 --max_sequences 16]

Texts from --input are filled several a row (packed rows: each attends
only to itself, with its own positions; the same results as one at a time),
--batch_size rows of --seq_length tokens at a time, in chunks of a few
thousand lines: memory does not grow with the file.

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
from bert_jax.downstream import packed_texts


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("Training workdir, HF directory, or converted dir.",
                   flag_values=flag_values)
  cli.define_step(flag_values=flag_values)
  flags.DEFINE_integer("top_k", 5, "Predictions per [MASK].",
                       flag_values=flag_values)
  flags.DEFINE_bool("json", False, "Print the HF pipeline-shaped list as "
                    "JSON.", flag_values=flag_values)
  flags.DEFINE_string("input", None, "A text file, one text with [MASK] per "
                      "line (instead of texts after the flags).",
                      flag_values=flag_values)
  cli.define_output("With --input: the JSON lines file to write.",
                    flag_values=flag_values, required=False)
  flags.DEFINE_integer("batch_size", 8, "With --input: packed rows a batch.",
                       flag_values=flag_values)
  flags.DEFINE_integer("seq_length", packed_texts.DEFAULT_SEQ_LENGTH,
                       "With --input: tokens a packed row (a longer text "
                       "gets longer rows, up to the model's positions).",
                       flag_values=flag_values)
  flags.DEFINE_integer("max_sequences", packed_texts.DEFAULT_MAX_SEQUENCES,
                       "With --input: texts a packed row holds at most.",
                       flag_values=flag_values)


def _from_file(args) -> int:
  """--input -> --output, one JSON result per line."""
  if not args.output:
    print("error: --input needs --output (the JSON lines file to write).",
          file=sys.stderr)
    return 1
  try:
    packed_texts.check(args.seq_length, args.max_sequences, args.batch_size)
    runner = mask_filling.FillMask(*mask_filling.load(args.model, args.step))
    n = mask_filling.write_file(
        runner, args.input, args.output, args.top_k,
        seq_length=args.seq_length, max_sequences=args.max_sequences,
        batch_size=args.batch_size)
  except (ValueError, OSError) as e:  # A wrong --model or line: one line.
    print(f"error: {e}", file=sys.stderr)
    return 1
  print(f"Wrote {args.output}: {n} lines.")
  return 0


def main(argv: list[str] | None = None) -> int:
  args, texts = cli.parse(argv, define_flags, __doc__, positional=True)
  if args.input is not None:
    if texts:
      print("error: give texts after the flags or --input, not both.",
            file=sys.stderr)
      return 1
    return _from_file(args)
  if not texts:
    print("error: give the text with [MASK] tokens after the flags (or "
          "--input FILE --output FILE).", file=sys.stderr)
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
