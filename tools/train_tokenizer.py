r"""Trains a SentencePiece model or a WordPiece vocab.txt on the configured sources.

  python tools/train_tokenizer.py --config=configs/<name>.py \
      [--config.data.tokenizer_type=wordpiece] \
      [--config.data.tokenizer_vocab_size=30522] [--workdir=/tmp/run] \
      [--output=gs://bucket/tok/vocab.txt]

Reads up to data.tokenizer_train_sentences lines from data.sources (or the
demo corpus, written into --workdir). Without --output the file goes where
tokenizers.load_tokenizer looks for its cache, so a training run with the
same config and workdir picks it up; otherwise point data.tokenizer_path at it.
"""

import sys

from absl import flags
from absl import logging

from bert_jax import cli
from bert_jax.data import tokenizers


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file.", argv=argv, **define)
  cli.define_workdir("Where the demo corpus / cached model go.",
                     default="/tmp/bert_jax_tokenizer", **define)
  cli.define_output("Output file (.model/vocab.txt; default: where a run "
                    "with this config and --workdir looks).", default="",
                    **define)


def main(argv):
  del argv
  data = flags.FLAGS.config.data
  out = flags.FLAGS.output or tokenizers.cache_path(data, flags.FLAGS.workdir)
  logging.info("Training %s (vocab %d) -> %s", data.tokenizer_type,
               data.tokenizer_vocab_size, out)
  try:
    tok = tokenizers.train(
        data.tokenizer_type,
        tokenizers.training_sentences(data, flags.FLAGS.workdir),
        data.tokenizer_vocab_size, data.lower_case, out,
        max_line_bytes=int(data.max_line_bytes))
  except (ValueError, OSError) as e:  # A bad corpus or path: one sentence.
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  print(f"Wrote {out}: {tok!r}")
  if tok.missing_special_tokens:
    print(f"WARNING: missing special tokens {tok.missing_special_tokens}")


if __name__ == "__main__":
  cli.run(main, define_flags)
