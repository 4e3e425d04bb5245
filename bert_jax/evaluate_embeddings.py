"""Score any model's sentence space: STS pairs, paraphrase pairs, BEIR
retrieval.

  python -m bert_jax.evaluate_embeddings --model PATH \
      [--pairs stsb/dev.tsv --text_field sentence1 --text_pair_field \
       sentence2 --label_field score] \
      [--beir BEIR_DIR --split test --top_k 100 --run_file run.trec] \
      [--output results.json]

--model: a workdir, step, imported, Hugging Face or sentence-transformers
directory (``bert_jax.downstream.sentence_embeddings``: its own pooling and
normalisation, else --pooling / --normalize). --pairs: CSV / TSV / JSONL
pairs with a score, scored as STS (Spearman, Pearson of the cosines) or,
for 0 / 1 labels, paraphrase detection at the best threshold (--metric
forces one). --beir: exact retrieval over the corpus, streamed (nDCG@10,
MRR@10, Recall@10/100, MAP@100, as trec_eval computes them on the
written --run_file). Every input is checked before anything is embedded:
a bad file is one line and exit 1, nothing written.
"""

import sys

from absl import flags

from bert_jax import cli
from bert_jax.data import beir
from bert_jax.data import pair_sources
from bert_jax.downstream import embedding_eval
from bert_jax.downstream import sentence_embeddings


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("Workdir, HF, imported or sentence-transformers "
                   "directory.", flag_values=flag_values)
  cli.define_step(flag_values=flag_values)
  cli.define_output("Results JSON (optional).", flag_values=flag_values,
                    required=False)
  define = dict(flag_values=flag_values)
  flags.DEFINE_string("pairs", None, "Scored pairs (CSV, TSV, JSONL).",
                      **define)
  flags.DEFINE_string("text_field", "sentence1", "First text column.",
                      **define)
  flags.DEFINE_string("text_pair_field", "sentence2", "Second text column.",
                      **define)
  flags.DEFINE_string("label_field", "score", "Score column.", **define)
  flags.DEFINE_enum("metric", "", ["", "sts", "binary"], "'' = binary for "
                    "0 / 1 labels, else STS.", **define)
  flags.DEFINE_string("beir", None, "BEIR directory (corpus.jsonl, "
                      "queries.jsonl, qrels/<split>.tsv).", **define)
  flags.DEFINE_string("split", "test", "The qrels split.", **define)
  flags.DEFINE_integer("top_k", 100, "Documents retrieved per query.",
                       **define)
  flags.DEFINE_string("run_file", None, "Write the retrieval run (TREC).",
                      **define)
  flags.DEFINE_enum("pooling", None, ["mean", "cls"], "Pooling of a model "
                    "without its own (default mean).", **define)
  flags.DEFINE_bool("normalize", None, "L2-normalise (default: the "
                    "model's own).", **define)
  flags.DEFINE_integer("max_length", None, "Tokens a text is cut to "
                       "(default: the model's).", **define)


def main(argv: list[str] | None = None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  if not (args.pairs or args.beir):
    print("error: give --pairs and / or --beir to score.", file=sys.stderr)
    return 1
  results = {}
  try:
    # Every input read and checked before the model loads.
    rows = (pair_sources.read_file(
        args.pairs, (args.text_field, args.text_pair_field),
        args.label_field) if args.pairs else None)
    retrieval = beir.read(args.beir, args.split) if args.beir else None
    embedder = sentence_embeddings.load(
        args.model, args.step, pooling=args.pooling,
        normalize=args.normalize, max_length=args.max_length)
    if rows is not None:
      results["pairs"] = embedding_eval.score_pairs(embedder, rows,
                                                    args.metric)
    if retrieval is not None:
      results["retrieval"], _ = embedding_eval.evaluate_retrieval(
          embedder, retrieval, args.top_k, args.run_file or "")
    if args.output:
      embedding_eval.write_results(args.output, dict(
          model=args.model, pooling=embedder.pooling,
          normalize=embedder.normalize, max_length=embedder.max_length,
          **results))
  except (OSError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 1
  for what, scores in results.items():
    print(what + ": " + "  ".join(f"{k} {v:.4f}" for k, v in scores.items()
                                  if not k.endswith("threshold")))
  return 0


if __name__ == "__main__":
  sys.exit(main())
