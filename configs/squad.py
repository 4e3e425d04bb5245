"""Fine-tune a checkpoint for extractive QA (SQuAD v1.1 / v2.0).

  python -m bert_jax.finetune --config configs/squad.py \
      --config.task.name=squad/v1.1 --config.task.tfds_data_dir=/data/tfds \
      --config.train.init_from=CHECKPOINT --workdir /tmp/ft_squad
Your own SQuAD JSON files (v2.0 when questions carry is_impossible):
  --config.task.name=myqa --config.task.train_file=train-v2.0.json \
  --config.task.validation_file=dev-v2.0.json
Defaults as google-research/bert's run_squad (BERT-base: 88.5 F1 / 81 EM
on v1.1 dev): seq 384, doc_stride 128, max_query_length 64, lr 3e-5,
2 epochs, batch 32 (the paper's 32 on 4 TPUs), n_best 20, max answer 30
tokens, null threshold 0. Writes WORKDIR/predictions/validation/
predictions.json and (v2) null_odds.json in the official formats:
  python evaluate-v2.0.py dev-v2.0.json predictions.json \
      --na-prob-file null_odds.json --na-prob-thresh 0
(--na-prob-thresh: the run's task.null_score_diff_threshold) prints
best_f1_thresh; rerun with --config.task.null_score_diff_threshold.
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
  config.task.update(name="squad/v1.1", kind="span", doc_stride=128,
                     buckets=(128, 256, 384))
  config.train.update(learning_rate=3e-5, num_epochs=2.0, batch_size=32)
  config.data.seq_length = 384
  return config
