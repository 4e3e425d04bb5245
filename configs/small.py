"""BERT-small (4x512, ~29M parameters with the 30,522-token vocabulary).

Run (demo corpus, tokenizer trained and cached in the workdir):
  python -m bert_jax.main --config configs/small.py --workdir /tmp/bert_small
Override any field, e.g. --config.train.num_steps=30 --config.train.batch_size=16.
Set --config.data.train_files='corpus/*.txt' for your own text (one sentence
per line, blank line between documents).
"""

from bert_jax import config_lib


def get_config():
  return config_lib.get_config("small")
