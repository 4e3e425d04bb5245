"""Fine-tune a checkpoint on a downstream task (Devlin et al. 2019 defaults).

Run (GLUE SST-2 from a prepared TFDS directory; nothing is downloaded):
  python -m bert_jax.finetune --config configs/finetune.py \
      --config.task.name=glue/sst2 --config.task.tfds_data_dir=/data/tfds \
      --config.train.init_from=/tmp/bert_demo --workdir /tmp/ft_sst2
Your own files (CSV, TSV or JSONL with a header / keys):
  --config.task.name=mytask --config.task.train_file=train.csv \
  --config.task.validation_file=dev.csv --config.task.text_field=text \
  --config.task.label_field=label [--config.task.text_pair_field=text_b]
Token tagging and extractive QA: configs/ner.py, configs/squad.py.
The model's architecture comes from the checkpoint; AdamW, 3 epochs, batch
32, 10% warmup, dropout 0.1, learning rate 2e-5 (sweep 2e-5, 3e-5, 5e-5 with
--sweep_learning_rates and --sweep_seeds). Results: WORKDIR/results.json.
"""

import ml_collections

from bert_jax import config_lib


def task_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      # glue/{cola,sst2,mrpc,qqp,stsb,mnli,qnli,rte,wnli} read from
      # tfds_data_dir, or any name when train_file is set.
      name="glue/sst2",
      tfds_data_dir="",
      # The user's own task: CSV / TSV / JSONL files (format by extension).
      train_file="",
      validation_file="",
      text_field="sentence",
      text_pair_field="",  # Empty: single-sentence task.
      label_field="label",
      regression=False,  # Float labels, MSE, Pearson/Spearman.
      label_order="sorted",  # String labels -> ids: "sorted" or "first_seen".
      # Names of the classes in id order (your file's labels in label_order:
      # numeric order for integer labels), e.g. ("negative", "positive")
      # for labels 0/1: results.json and the export's id2label. () = the
      # labels themselves.
      label_names=(),
      # A rerun in a workdir holding a checkpoint of other train /
      # validation files is refused (WORKDIR/task.json records them); True
      # goes on from the checkpoint with the new files (same labels).
      continue_with_new_files=False,
      # Static sequence lengths batches are padded to (capped by
      # data.seq_length): one compile per bucket, little padding.
      buckets=(32, 64, 128),
      # "sentence", "token" (NER) or "span" (extractive QA); empty: from
      # the name (conll2003 -> token, squad/v1.1, squad/v2.0 -> span, else
      # sentence). See configs/ner.py and configs/squad.py.
      kind="",
      # Token tasks: CoNLL files (tag in column tag_column, -1 = last) or
      # JSONL {tokens_field: [...], tags_field: [...]}.
      tag_column=-1,
      tokens_field="tokens",
      tags_field="tags",
      label_all_subtokens=False,  # Else only a word's first sub-token.
      # Tokens between window starts over a long sentence / context; 0:
      # half the window (token tasks), 128 (span tasks, run_squad's).
      doc_stride=0,
      # Span tasks (SQuAD): question cut, answer search, v2 null threshold.
      max_query_length=64,
      n_best_size=20,
      max_answer_length=30,
      null_score_diff_threshold=0.0,
  ))


def get_config():
  config = config_lib.get_config("base")  # model: replaced by the checkpoint's.
  config.objective.name = "classify"
  config.task = task_config()
  config.data.seq_length = 128
  config.train.update(
      num_steps=0,  # 0: num_epochs over the training split.
      num_epochs=3.0,
      batch_size=32,
      learning_rate=2e-5,
      warmup_steps=0,
      warmup_fraction=0.1,
      weight_decay=0.01,
      adam_eps=1e-6,
      max_grad_norm=1.0,
      log_every=50,
      eval_every=1_000_000,  # Evaluated at the end (set lower to follow it).
      init_from="",
      init_from_step=0,  # A workdir's step; 0 = its latest.
      peak_tflops=1.0,  # MFU is not the point here: skip the matmul probe.
  )
  config.checkpoint.save_every_steps = 1000
  config.checkpoint.max_to_keep = 1
  return config
