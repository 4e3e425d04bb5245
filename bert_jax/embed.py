"""Contextual embeddings from a BERT checkpoint: one vector per sentence.

  python -m bert_jax.embed --model WORKDIR_OR_HF_DIR [--step N] \
      --pooling cls|mean --layer -1 --input sentences.txt --output vectors.npy \
      [--per_token tokens.npz]

`--layer` indexes hidden states as Hugging Face's ``output_hidden_states``
does: 0 is the embeddings output, 1..L the blocks, -1 the last block.
"cls" takes the layer's vector at [CLS] (not the NSP pooler: that one is
untrained in runs without NSP); "mean" averages the real tokens only.
Sentences are packed several a row of --seq_length tokens (within chunks of
a few thousand lines), each attending only to itself with its own positions
(the vectors it gets alone, no padding computed), --batch_size rows a batch;
--nopacking sorts them by length and pads them to a few static lengths (32,
64, 128, ... up to the model's max_position_embeddings). Either way XLA
compiles once per length in use, never per batch. The outputs are streamed:
memory does not grow with the input.
"""

import os
import sys

from absl import flags

from bert_jax import cli
from bert_jax.downstream import embeddings
from bert_jax.downstream import packed_texts
from bert_jax.hf import mapping


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("Training workdir, HF BERT directory or imported "
                   "directory.", flag_values=flag_values)
  cli.define_step(flag_values=flag_values)
  cli.define_output("Output .npy [N, H].", flag_values=flag_values)
  define = dict(flag_values=flag_values)
  flags.DEFINE_enum("pooling", "cls", embeddings.POOLINGS, "Vector of a "
                    "sentence: its [CLS] position or the mean of its tokens.",
                    **define)
  flags.DEFINE_integer("layer", -1, "Hidden state index: 0 embeddings, -1 "
                       "last layer.", **define)
  flags.DEFINE_string("input", None, "Text file, one sentence per line.",
                      **define)
  flags.mark_flag_as_required("input", flag_values=flag_values)
  flags.DEFINE_string("per_token", None, "Also write per-token vectors and "
                      "tokens (.npz).", **define)
  flags.DEFINE_integer("batch_size", 32, "Sentences per batch (with "
                       "--packing: packed rows per batch).", **define)
  flags.DEFINE_bool("packing", True, "Several sentences a row of "
                    "--seq_length tokens, each attending only to itself (the "
                    "same vectors, no padding computed); --nopacking: "
                    "length buckets.", **define)
  flags.DEFINE_integer("seq_length", packed_texts.DEFAULT_SEQ_LENGTH,
                       "With --packing: tokens a row (a longer sentence "
                       "gets longer rows).", **define)
  flags.DEFINE_integer("max_sequences", packed_texts.DEFAULT_MAX_SEQUENCES,
                       "With --packing: sentences a row holds at most.",
                       **define)
  flags.DEFINE_integer("max_length", None, "Truncate longer texts (default: "
                       "the model's max_position_embeddings).", **define)


def main(argv: list[str] | None = None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  try:
    embeddings.check_input(args.input)
    loaded = embeddings.load_model(args.model, args.step)
    max_length = embeddings.check_max_length(args.max_length, loaded.model_config)
    model = mapping.make_model(loaded.params, loaded.model_config,
                               loaded.table)
    for path in filter(None, (args.output, args.per_token)):
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    rows, hidden, tokens = embeddings.write_embeddings(
        model, loaded.tokenizer, args.input, args.output, args.per_token,
        pooling=args.pooling, layer=args.layer, batch_size=args.batch_size,
        max_length=max_length, packing=args.packing,
        seq_length=args.seq_length, max_sequences=args.max_sequences)
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  n_layers = int(loaded.model_config.num_hidden_layers)
  layer = embeddings.resolve_layer(args.layer, n_layers)
  print(f"Wrote {args.output}: {rows} x {hidden} float32 "
        f"({args.pooling} pooling, hidden state {layer} of 0..{n_layers}).")
  if args.per_token:
    print(f"Wrote {args.per_token}: {tokens} token vectors.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
