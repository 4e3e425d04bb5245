"""Zero-shot cloze classification: a task rephrased as fill-in-the-blank.

  python -m bert_jax.zero_shot --model WORKDIR_OR_HF_DIR --input dev.tsv \
      --template "{text} It was [MASK]." --verbalizer terrible,great \
      [--labels 0,1] [--text_field sentence] [--label_field label]

Each example fills the template ({text}, optionally {text_b}); the score of
a label is the MLM log-probability (softmax over the whole vocabulary) of its
verbalizer word at the [MASK]; the prediction is the best-scoring label. No
training: this asks what the pretrained MLM head already knows. A text too
long for the model is cut (its end, longest of text/text_b first) so the
template around it, [MASK] included, always survives.
"""

import argparse
import json
import sys

from bert_jax.downstream import cloze


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m bert_jax.zero_shot",
      description="Zero-shot cloze classification with the MLM head.")
  parser.add_argument("--model", required=True,
                      help="Training workdir, HF BERT directory with an MLM "
                      "head, or imported directory.")
  parser.add_argument("--step", type=int, default=None)
  parser.add_argument("--input", required=True, help=".csv, .tsv or .jsonl")
  parser.add_argument("--template", required=True,
                      help='e.g. "{text} It was [MASK]."')
  parser.add_argument("--verbalizer", required=True,
                      help="One word per label: 'terrible,great' (labels "
                      "from --labels) or 'neg:terrible,pos:great'.")
  parser.add_argument("--labels", default=None,
                      help="Labels for a plain word list (default 0,1,...).")
  parser.add_argument("--text_field", default="text")
  parser.add_argument("--text_b_field", default=None)
  parser.add_argument("--label_field", default="label")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--max_length", type=int, default=None)
  parser.add_argument("--predictions", default=None,
                      help="Write per-example predictions and scores (.jsonl).")
  args = parser.parse_args(argv)
  try:
    cloze.check_template(args.template)
    verbalizer = cloze.parse_verbalizer(args.verbalizer)
    if args.labels:
      labels = [l.strip() for l in args.labels.split(",")]
      if len(labels) != len(verbalizer):
        raise ValueError(f"--labels {args.labels!r} has {len(labels)} labels "
                         f"but --verbalizer has {len(verbalizer)} words.")
      verbalizer = dict(zip(labels, verbalizer.values()))
    rows = cloze.read_rows(args.input)
    examples, bad = cloze.examples_from_rows(rows, args.text_field,
                                       args.text_b_field, args.label_field)
    if not examples:
      raise ValueError(f"--input {args.input} has no usable rows (fields "
                       f"{args.text_field!r}"
                       + (f", {args.text_b_field!r}" if args.text_b_field
                          else "") + ").")
    result = cloze.zero_shot_classify(args.model, examples, args.template,
                                verbalizer, step=args.step,
                                batch_size=args.batch_size,
                                max_length=args.max_length)
    if args.predictions:
      with open(args.predictions, "w") as f:
        for ex, p, s in zip(examples, result["predictions"], result["scores"]):
          f.write(json.dumps(dict(text=ex[0], text_b=ex[1], label=ex[2],
                                  prediction=p, scores=dict(zip(
                                      result["labels"],
                                      map(float, s))))) + "\n")
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  if bad:
    shown = ", ".join(f"{n} ({why})" for n, why in bad[:5])
    print(f"Skipped {len(bad)} bad row(s) (data rows, from 1): {shown}"
          + (" ..." if len(bad) > 5 else ""))
  counts = {l: result["predictions"].count(l) for l in result["labels"]}
  print("Predicted: " + ", ".join(
      f"{l} ({verbalizer[l]}) {c}" for l, c in counts.items()))
  if result["num_truncated"]:
    print(f"Truncated {result['num_truncated']} texts to fit "
          f"max_length.")
  acc = result["accuracy"]
  print("Zero-shot accuracy: "
        + (f"{acc:.4f} ({result['num_labeled']} labeled examples)"
           if acc is not None else "n/a (no labels)"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
