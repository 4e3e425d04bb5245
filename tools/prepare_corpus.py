r"""Prepare JSONL / Parquet corpora as pretraining text, once, in parallel.

  python tools/prepare_corpus.py --sources 'parquet:gs://b/fineweb/*.parquet' \
      --output gs://b/prepared [--text_field text] [--workers 16]

What a run does by itself for ``data.sources='jsonl:...'`` or
``'parquet:...'`` (into WORKDIR/prepared), done ahead of time for a corpus
several runs share: each record file becomes one text file (one sentence per
line, a blank line after each document; ``bert_jax/data/records.py``),
streamed record by record, one worker process per file. Rerunning converts
only new or changed files. Then train with the same source and
``--config.data.prepared_dir=OUTPUT`` (the run finds the files prepared),
or with the text files it prints as a text source: both give the same
batches as the record source.
"""

import sys

from absl import flags

# Imports of bert_jax are inside the functions, not at the top: the worker
# processes (spawned, so they import this script again) need
# bert_jax.data.records alone, not JAX, Orbax or TensorFlow (seconds and
# hundreds of MB each).


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  define = dict(flag_values=flag_values)
  flags.DEFINE_string("sources", None, "jsonl:GLOB or parquet:GLOB (several: "
                      "';').", **define)
  flags.mark_flag_as_required("sources", flag_values=flag_values)
  cli.define_output("Where the text files go (data.prepared_dir).",
                    aliases=("output_dir",), **define)
  flags.DEFINE_string("text_field", "text", "The field / column holding a "
                      "record's text.", **define)
  flags.DEFINE_integer("workers", 0, "Processes converting files (0: the CPU "
                       "count for large inputs, else one).", **define)


def main(argv=None) -> int:
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  from bert_jax.data import prepared_text  # pylint: disable=g-import-not-at-top
  from bert_jax.data import records  # pylint: disable=g-import-not-at-top
  from bert_jax.data import sources as data_sources  # pylint: disable=g-import-not-at-top
  args, _ = cli.parse(argv, define_flags, __doc__)
  try:
    parsed = data_sources.parse_sources(args.sources, "--sources")
    for source in parsed:
      if source.kind not in records.KINDS:
        raise ValueError(f"--sources: {source} is not a jsonl: or parquet: "
                         "source; text and TFDS sources need no preparing.")
      inputs, _ = data_sources.resolve_text_files(source, "--sources")
      print(prepared_text.prepare(
          source.kind, source.spec, inputs, args.text_field,
          args.output, field="--sources", weight=source.weight,
          workers=args.workers, process_index=0))
  except (ValueError, OSError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
