"""Fine-tune a checkpoint for token tagging (NER), e.g. CoNLL-2003.

  python -m bert_jax.finetune --config configs/ner.py \
      --config.task.name=conll2003 --config.task.tfds_data_dir=/data/tfds \
      --config.train.init_from=CHECKPOINT --workdir /tmp/ft_ner
Your own files: CoNLL columns (a word per line, the tag in the last column
or --config.task.tag_column, blank lines between sentences) or JSONL
{"tokens": [...], "tags": [...]}:
  --config.task.name=mytags --config.task.train_file=train.txt \
  --config.task.validation_file=dev.txt
Scores: conlleval entity F1 (micro and per type) and token accuracy in
WORKDIR/results.json; WORKDIR/predictions/<split>/predictions.conll is
`word gold predicted` per line (conlleval < predictions.conll).
Defaults as Hugging Face's run_ner: 3 epochs, lr 5e-5, batch 32, seq 128.
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
  config.task.update(name="conll2003", kind="token")
  config.train.update(learning_rate=5e-5, num_epochs=3.0, batch_size=32)
  config.data.seq_length = 128
  return config
