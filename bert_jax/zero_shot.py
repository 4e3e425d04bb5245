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

import json
import sys

from absl import flags

from bert_jax import cli
from bert_jax.downstream import cloze


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("Training workdir, HF BERT directory with an MLM head, or "
                   "imported directory.", flag_values=flag_values)
  cli.define_step(flag_values=flag_values)
  define = dict(flag_values=flag_values)
  flags.DEFINE_string("input", None, ".csv, .tsv or .jsonl", **define)
  flags.DEFINE_string("template", None, 'e.g. "{text} It was [MASK]."',
                      **define)
  flags.DEFINE_string("verbalizer", None, "One word per label: "
                      "'terrible,great' (labels from --labels) or "
                      "'neg:terrible,pos:great'.", **define)
  flags.mark_flags_as_required(["input", "template", "verbalizer"],
                               flag_values=flag_values)
  flags.DEFINE_string("labels", None, "Labels for a plain word list "
                      "(default 0,1,...).", **define)
  flags.DEFINE_string("text_field", "text", "Field of the text.", **define)
  flags.DEFINE_string("text_b_field", None, "Field of the second text.",
                      **define)
  flags.DEFINE_string("label_field", "label", "Field of the label.", **define)
  flags.DEFINE_integer("batch_size", 32, "Examples per batch.", **define)
  flags.DEFINE_integer("max_length", None, "Truncate longer texts (default: "
                       "the model's max_position_embeddings).", **define)
  flags.DEFINE_string("predictions", None, "Write per-example predictions "
                      "and scores (.jsonl).", **define)


def main(argv: list[str] | None = None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
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
