"""BERT-base (12x768, ~110M parameters with the 30,522-token vocabulary).

Run (demo corpus, tokenizer trained and cached in the workdir):
  python -m bert_jax.main --config configs/base.py --workdir /tmp/bert_base
Override any field, e.g. --config.train.num_steps=30 --config.train.batch_size=16.
Set --config.data.train_files='corpus/*.txt' for your own text (one sentence
per line, blank line between documents).
"""

from bert_jax import config_lib


def get_config():
  return config_lib.get_config("base")
