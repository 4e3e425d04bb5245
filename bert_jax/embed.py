"""Sentence vectors from any model: one vector per line of a text file.

  python -m bert_jax.embed --model MODEL --input sentences.txt \
      --output vectors.npy [--shard_rows N] [--pooling cls|mean] \
      [--normalize] [--step N] [--layer L --per_token tokens.npz]

MODEL: a workdir, step, imported, Hugging Face or sentence-transformers
directory. An embedding model (a sentence-transformers directory, a
``pairs`` fine-tuning run) brings its pooling, normalisation and text
length; any other encoder is pooled by --pooling (default cls: its [CLS]
vector; mean: the mean of the real tokens).

The last layer's vectors are computed on packed rows
(``downstream/sentence_embeddings``): several sentences a row, attention
inside each sentence, no padding computed but a row's tail; each vector
equals the sentence's alone. They stream to --output (.npy [N, d]
float32) or, with --shard_rows, to OUTPUT-00000.npy, ... of that many rows
each: memory does not grow with the input. --layer (0 = the embeddings
output, 1..L the blocks, -1 the last) and --per_token (an .npz of every
token's vector) take ``downstream/embeddings``: sentences packed several a
row of --seq_length tokens as well, or with --nopacking sorted by length
and padded to a few static lengths (--nopacking sends the last layer's
vectors there too).
"""

import os
import sys

from absl import flags

from bert_jax import cli
from bert_jax.downstream import embeddings
from bert_jax.downstream import packed_texts
from bert_jax.downstream import sentence_embeddings
from bert_jax.hf import mapping


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("Training workdir, HF, imported or sentence-transformers "
                   "directory.", flag_values=flag_values)
  cli.define_step(flag_values=flag_values)
  cli.define_output("Output .npy [N, H] (the shards' stem with "
                    "--shard_rows).", flag_values=flag_values)
  define = dict(flag_values=flag_values)
  flags.DEFINE_enum("pooling", None, embeddings.POOLINGS, "A sentence's "
                    "vector: its [CLS] position or the mean of its tokens "
                    "(default: the model's own, else cls).", **define)
  flags.DEFINE_bool("normalize", None, "L2-normalise the vectors (default: "
                    "the model's own, else no).", **define)
  flags.DEFINE_integer("layer", -1, "Hidden state index: 0 embeddings, -1 "
                       "last layer.", **define)
  flags.DEFINE_string("input", None, "Text file, one sentence per line.",
                      **define)
  flags.mark_flag_as_required("input", flag_values=flag_values)
  flags.DEFINE_string("per_token", None, "Also write per-token vectors and "
                      "tokens (.npz).", **define)
  flags.DEFINE_integer("shard_rows", 0, "Write .npy shards of this many "
                       "rows (0: one file).", **define)
  flags.DEFINE_integer("batch_size", 32, "--layer / --per_token / "
                       "--nopacking: sentences per batch (packed: rows per "
                       "batch).", **define)
  flags.DEFINE_bool("packing", True, "--layer / --per_token: several "
                    "sentences a row of --seq_length tokens, each attending "
                    "only to itself (the same vectors, no padding computed); "
                    "--nopacking: length buckets, for every layer.", **define)
  flags.DEFINE_integer("seq_length", packed_texts.DEFAULT_SEQ_LENGTH,
                       "--layer / --per_token: tokens a packed row (a longer "
                       "sentence gets longer rows).", **define)
  flags.DEFINE_integer("max_sequences", packed_texts.DEFAULT_MAX_SEQUENCES,
                       "--layer / --per_token: sentences a packed row holds "
                       "at most.", **define)
  flags.DEFINE_integer("max_length", None, "Truncate longer texts (default: "
                       "the model's length).", **define)


def _any_layer(args) -> str:
  """--layer / --per_token / --nopacking: any hidden state, packed or
  bucketed; returns what it wrote."""
  loaded = embeddings.load_model(args.model, args.step)
  max_length = embeddings.check_max_length(args.max_length,
                                           loaded.model_config)
  pooling = args.pooling or loaded.model_config.get(
      "embedding_pooling", "") or "cls"
  model = mapping.make_model(loaded.params, loaded.model_config,
                             loaded.table)
  rows, hidden, tokens = embeddings.write_embeddings(
      model, loaded.tokenizer, args.input, args.output, args.per_token,
      pooling=pooling, layer=args.layer, batch_size=args.batch_size,
      max_length=max_length, packing=args.packing,
      seq_length=args.seq_length, max_sequences=args.max_sequences)
  n_layers = int(loaded.model_config.num_hidden_layers)
  layer = embeddings.resolve_layer(args.layer, n_layers)
  out = (f"Wrote {args.output}: {rows} x {hidden} float32 ({pooling} "
         f"pooling, hidden state {layer} of 0..{n_layers}).")
  if args.per_token:
    out += f"\nWrote {args.per_token}: {tokens} token vectors."
  return out


def main(argv: list[str] | None = None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  try:
    embeddings.check_input(args.input)
    if args.shard_rows < 0:
      raise ValueError(f"--shard_rows={args.shard_rows} must be >= 0.")
    for path in filter(None, (args.output, args.per_token)):
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if args.layer != -1 or args.per_token or not args.packing:
      if args.shard_rows or args.normalize:
        raise ValueError("--shard_rows and --normalize apply to the last "
                         "layer's pooled vectors on packed rows (no --layer, "
                         "no --per_token, no --nopacking).")
      print(_any_layer(args))
      return 0
    embedder = sentence_embeddings.load(
        args.model, args.step, pooling=args.pooling,
        normalize=args.normalize, max_length=args.max_length,
        default_pooling="cls")
    rows, files = sentence_embeddings.write(embedder, args.input,
                                            args.output, args.shard_rows)
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  norm = ", normalised" if embedder.normalize else ""
  print(f"Wrote {rows} x {embedder.dimension} float32 vectors "
        f"({embedder.pooling} pooling{norm}, {embedder.max_length} tokens at "
        f"most) to {', '.join(files)}.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
