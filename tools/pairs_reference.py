r"""The pairs kind's recipe, and the same recipe in sentence-transformers.

  python tools/pairs_reference.py --config configs/pairs.py \
      --config.train.init_from=MODEL --workdir OUT \
      --config.objective.pair_loss=cosent \
      --config.task.train_file=../shared/data/stsb/train.tsv \
      --config.task.validation_file=../shared/data/stsb/dev.tsv \
      [--sts_dev ../shared/data/stsb/dev.tsv]

MODEL: a sentence-transformers or Hugging Face directory, or a bert_jax
pretraining workdir (exported first to OUT/init, with mean pooling, so
that both sides start from the same weights). For MRPC paraphrases with
in-batch negatives, give its files, columns ("#1 String", "#2 String",
Quality) and score_range (0, 1), and pair_loss=infonce.

Both sides start from the same directory and train on the same rows (our
reader's: for InfoNCE the pairs labelled positive) for the same number of
steps, batch size, learning rate and warmup, weight decay, clipping, Adam
epsilon, text length, loss and scale; then both are scored on --sts_dev
(STS-B dev: Spearman of cosine against the gold scores; our metric, and
sentence-transformers' EmbeddingSimilarityEvaluator for theirs) before and
after. Ours: ``bert_jax.finetune``'s run (OUT/ours). Theirs:
``SentenceTransformerTrainer`` (OUT/theirs). Batch order and dropout draws
differ between the two; the scores should land within a point. Writes
OUT/reference.json and prints a table.
"""

from __future__ import annotations

import csv
import json
import os
import sys

from absl import flags

from bert_jax import cli
from bert_jax import export
from bert_jax import pretrained
from bert_jax.downstream import finetuning
from bert_jax.downstream import sentence_embeddings
from bert_jax.hf import sentence_transformers as st_files
from bert_jax.tasks import pair_metrics


def define_flags(flag_values, argv=None) -> None:
  define = dict(flag_values=flag_values)
  cli.define_config("configs/pairs.py and overrides.", argv=argv, **define)
  cli.define_workdir("Where both runs go.", **define)
  flags.DEFINE_string("sts_dev", None, "STS pairs (sentence1, sentence2, "
                      "score) scored before and after (default: "
                      "task.validation_file).", **define)


FLAGS = flags.FLAGS


def read_sts(path: str):
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
  return ([r["sentence1"] for r in rows], [r["sentence2"] for r in rows],
          [float(r["score"]) for r in rows])


def our_spearman(model_dir: str, sts, max_length: int) -> float:
  embedder = sentence_embeddings.load(model_dir, max_length=max_length)
  a, b, gold = sts
  return pair_metrics.sts(pair_metrics.cosine(embedder.encode(a),
                                              embedder.encode(b)),
                          gold)["spearman"]


def their_spearman(model, sts) -> float:
  # torch and sentence-transformers: only for the library's side.
  from sentence_transformers.sentence_transformer import evaluation
  a, b, gold = sts
  out = evaluation.EmbeddingSimilarityEvaluator(a, b, gold, name="sts")(model)
  return float(out["sts_spearman_cosine"])


def start_dir(config, workdir: str) -> str:
  """A directory both sides load: MODEL itself when it is a Hugging Face
  or sentence-transformers directory, else its export with mean pooling."""
  source = pretrained.resolve(config.train.init_from)
  if source.kind == pretrained.HF:
    return source.path
  out = os.path.join(workdir, "init")
  export.export_run(config.train.init_from, out)
  st_files.write(out, dimension=int(source.config.model.hidden_size),
                 modules=st_files.Modules("mean", False,
                                          int(config.data.seq_length)))
  return out


def theirs(config, init: str, train, out: str):
  """SentenceTransformerTrainer on `train` with the run's recipe."""
  from datasets import Dataset  # pylint: disable=g-import-not-at-top  (torch)
  import sentence_transformers as st  # pylint: disable=g-import-not-at-top
  from sentence_transformers.sentence_transformer import losses
  model = st.SentenceTransformer(init, device="cpu")
  model.max_seq_length = int(config.data.seq_length)
  scale, t = float(config.objective.pair_scale), config.train
  if config.objective.pair_loss == "cosent":
    data = Dataset.from_dict({"sentence1": list(train.texts[0]),
                              "sentence2": list(train.texts[1]),
                              "score": train.scores.tolist()})
    loss = losses.CoSENTLoss(model, scale=scale)
  else:
    data = Dataset.from_dict({f"t{k}": list(x)
                              for k, x in enumerate(train.texts)})
    loss = losses.MultipleNegativesRankingLoss(model, scale=scale)
  args = st.SentenceTransformerTrainingArguments(
      output_dir=out, per_device_train_batch_size=int(t.batch_size),
      max_steps=int(t.num_steps), learning_rate=float(t.learning_rate),
      warmup_steps=int(t.warmup_steps), weight_decay=float(t.weight_decay),
      max_grad_norm=float(t.max_grad_norm), adam_epsilon=float(t.adam_eps),
      adam_beta1=float(t.adam_b1), adam_beta2=float(t.adam_b2),
      lr_scheduler_type="linear", report_to="none", save_strategy="no",
      logging_strategy="no", disable_tqdm=True, dataloader_drop_last=True,
      use_cpu=True, seed=int(t.seed))
  st.SentenceTransformerTrainer(model=model, args=args, train_dataset=data,
                                loss=loss).train()
  return model


def main(argv):
  del argv
  config, workdir = FLAGS.config, FLAGS.workdir
  try:
    sts = read_sts(FLAGS.sts_dev or config.task.validation_file)
    os.makedirs(workdir, exist_ok=True)
    init = start_dir(config, workdir)
    config.train.init_from = init
    kind = finetuning.task_kind(config)
    task, train, _ = kind.read(config, "")
    length = int(config.data.seq_length)
    before = our_spearman(init, sts, length)
    ours = finetuning.run(config, os.path.join(workdir, "ours"))
    after = our_spearman(os.path.join(workdir, "ours"), sts, length)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  import sentence_transformers as st  # (torch) only for the library's side
  lib_before = their_spearman(st.SentenceTransformer(init, device="cpu"),
                              sts)
  done = finetuning.resolve_config(config, pretrained.resolve(init), task,
                                   len(train))
  model = theirs(done, init, train, os.path.join(workdir, "theirs"))
  lib_after = their_spearman(model, sts)
  result = dict(model=init, loss=done.objective.pair_loss,
                train_file=config.task.train_file, steps=ours["step"],
                batch_size=int(done.train.batch_size),
                sts_dev=FLAGS.sts_dev or config.task.validation_file,
                spearman=dict(ours_before=before, ours_after=after,
                              theirs_before=lib_before,
                              theirs_after=lib_after),
                difference_points=100 * (after - lib_after))
  with open(os.path.join(workdir, "reference.json"), "w") as f:
    json.dump(result, f, indent=1)
  print(f"STS dev Spearman x100 ({result['loss']}, {result['steps']} steps "
        f"of {result['batch_size']}):\n"
        f"  bert_jax              {100 * before:6.2f} -> {100 * after:6.2f}\n"
        f"  sentence-transformers {100 * lib_before:6.2f} -> "
        f"{100 * lib_after:6.2f}\n"
        f"  difference after      {result['difference_points']:+.2f} points")


if __name__ == "__main__":
  cli.run(main, define_flags)
