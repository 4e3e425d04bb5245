"""Contextual embeddings from a BERT checkpoint: one vector per sentence.

  python -m bert_jax.embed --model WORKDIR_OR_HF_DIR [--step N] \
      --pooling cls|mean --layer -1 --input sentences.txt --output vectors.npy \
      [--per_token tokens.npz]

`--layer` indexes hidden states as Hugging Face's ``output_hidden_states``
does: 0 is the embeddings output, 1..L the blocks, -1 the last block.
"cls" takes the layer's vector at [CLS] (not the NSP pooler: that one is
untrained in runs without NSP); "mean" averages the real tokens only.
Sentences are sorted by length (within chunks of a few thousand lines) and
padded to a few static lengths (32, 64, 128, ... up to the model's
max_position_embeddings), so XLA compiles once per length in use, never per
batch. The outputs are streamed: memory does not grow with the input.
"""

import argparse
import os
import sys

from bert_jax.downstream import embeddings
from bert_jax.hf import mapping


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m bert_jax.embed",
      description="Write one contextual vector per input line (.npy).")
  parser.add_argument("--model", required=True,
                      help="Training workdir, HF BERT directory or imported "
                      "directory.")
  parser.add_argument("--step", type=int, default=None,
                      help="Checkpoint step of a workdir (default: latest).")
  parser.add_argument("--pooling", choices=embeddings.POOLINGS, default="cls")
  parser.add_argument("--layer", type=int, default=-1,
                      help="Hidden state index: 0 embeddings, -1 last layer.")
  parser.add_argument("--input", required=True,
                      help="Text file, one sentence per line.")
  parser.add_argument("--output", required=True, help="Output .npy [N, H].")
  parser.add_argument("--per_token", default=None,
                      help="Also write per-token vectors and tokens (.npz).")
  parser.add_argument("--batch_size", type=int, default=32)
  parser.add_argument("--max_length", type=int, default=None,
                      help="Truncate longer texts (default: the model's "
                      "max_position_embeddings).")
  args = parser.parse_args(argv)
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
        max_length=max_length)
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
