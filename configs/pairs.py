"""Train sentence embeddings on sentence pairs (task kind "pairs").

STS Benchmark pairs with their 0-5 scores, CoSENT, from any checkpoint
(a sentence-transformers directory keeps its pooling and normalisation):
  python -m bert_jax.finetune --config configs/pairs.py \
      --config.train.init_from=CHECKPOINT --workdir /tmp/sts \
      --config.objective.pair_loss=cosent \
      --config.task.train_file=stsb/train.tsv \
      --config.task.validation_file=stsb/dev.tsv
Paraphrase pairs (MRPC: the rows labelled 1 are the positives) with
in-batch negatives, scored as paraphrase detection:
  --config.task.train_file=mrpc/train.tsv --config.task.validation_file=\
mrpc/dev.tsv --config.task.text_field="#1 String" \
  --config.task.text_pair_field="#2 String" --config.task.label_field=Quality
Add --config.task.retrieval_dir=BEIR_DIR to score retrieval (nDCG@10, ...)
as well. Scores in WORKDIR/results.json, metrics.jsonl and TensorBoard;
export with `python -m bert_jax.to_hf` (a sentence-transformers directory).
Defaults as sentence-transformers' trainer: AdamW lr 2e-5, 10% warmup,
1 epoch, batch 32, scale 20 (docs/embeddings-and-retrieval.md); texts
packed into rows (data.packing=False pads each to its batch's bucket).
"""

import importlib.util
import os


def get_config():
  spec = importlib.util.spec_from_file_location(
      "configs_finetune", os.path.join(os.path.dirname(__file__),
                                       "finetune.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.objective.name = "embed"
  config.task.update(
      name="pairs", kind="pairs", text_field="sentence1",
      text_pair_field="sentence2", label_field="score",
      # Hard-negative columns of each training row (InfoNCE).
      negative_fields=(),
      # (low, high): a score outside it is refused; () = no check.
      score_range=(0.0, 5.0),
      # InfoNCE on scored rows: rows scoring below this are no positives.
      positive_threshold=0.5,
      # Validation pairs: "sts" (Spearman / Pearson), "binary" (paraphrase
      # detection at the best threshold), "" = binary for 0 / 1 labels.
      pair_metric="",
      # The head: "mean", "cls" or "" (the checkpoint's own, else mean);
      # L2 normalisation "true", "false" or "" (the checkpoint's own).
      pooling="", normalize="",
      # A BEIR directory (corpus.jsonl, queries.jsonl, qrels/<split>.tsv)
      # scored as retrieval at every evaluation; top-k documents kept.
      retrieval_dir="", retrieval_split="test", retrieval_k=100)
  config.model.update(hidden_dropout_prob=0.1,
                      attention_probs_dropout_prob=0.1)
  config.train.update(learning_rate=2e-5, num_epochs=1.0, batch_size=32,
                      weight_decay=0.0)
  # Sentences are short: a batch's texts packed several a row (the same
  # vectors and loss, no padding computed), the rows as long as the
  # shortest of these lengths that holds them (one compile each).
  config.data.update(seq_length=128, packing=True)
  config.task.buckets = (16, 24, 32, 48, 64, 96, 128)
  return config
