"""Tokenize a corpus once into shards a run trains from.

  python -m bert_jax.pretokenize --config configs/roberta_base.py \
      --config.data.sources='corpus/*.txt' \
      [--config.train.init_from=HF_DIR] --output SHARDS [--workers N]

then train with --config.data.sources=shards:SHARDS (the run takes the
shards' tokenizer unless it names one, which must be the same).

The tokenizer is the one the config's run would use: data.tokenizer_path,
else train.init_from's, else one trained on the sources (cached under
SHARDS/tokenizer/). Each text file of data.sources (JSONL / Parquet are
prepared into text first) becomes one shard, tokenized by one of --workers
processes (default: one per core) with the pipeline's own graph, cut into
the data.block_lines blocks a run from the text reads. SHARDS/manifest.json
(written last) records the token and document counts and the tokenizer's
hash; bert_jax/data/shard_format.py describes the files.
"""

import sys

from absl import flags

from bert_jax import cli
from bert_jax.data import pretokenizing
from bert_jax.data import shard_format
from bert_jax.data import tokenizers
from bert_jax.hf import tokenizer_files
from bert_jax.training import start_from


def define_flags(flag_values, argv=None) -> None:
  cli.define_config("Config whose data.sources (and tokenizer) to use.",
                    flag_values=flag_values, argv=argv)
  cli.define_output("The shards directory to write.", flag_values=flag_values)
  flags.DEFINE_integer("workers", 0, "Processes tokenizing files at once "
                       "(0: one per core).", flag_values=flag_values)
  cli.define_verbose(flag_values=flag_values)


def pretokenize(config, output: str, workers: int) -> shard_format.Manifest:
  """The run's tokenizer (given, init_from's, or trained into OUTPUT), then
  the shards."""
  if shard_format.exists(f"{output}/{shard_format.MANIFEST}"):
    raise ValueError(f"--output={output} already holds shards "
                     f"({shard_format.MANIFEST}); write them elsewhere.")
  config = start_from.resolve(config, output)
  tok = tokenizers.load_tokenizer(config.data, output)
  spec = tokenizer_files.TokenizerSpec(tok.kind, tok.path, tok.lower_case)
  return pretokenizing.write_shards(config.data, spec, output, workers)


def main(argv=None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  manifest = cli.call(lambda: pretokenize(args.config, args.output,
                                          args.workers))
  print(f"Wrote {args.output}: {len(manifest.shards)} shards, "
        f"{manifest.documents} documents, {manifest.tokens} tokens "
        f"({manifest.tokenizer['kind']} {manifest.tokenizer['file']}).")
  return 0


if __name__ == "__main__":
  sys.exit(main())
