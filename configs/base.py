"""BERT-base (12x768, ~110M parameters with the 30,522-token vocabulary).

Run (demo corpus, tokenizer trained and cached in the workdir):
  python -m bert_jax.main --config configs/base.py --workdir /tmp/bert_base
Override any field, e.g. --config.train.num_steps=30 --config.train.batch_size=16.
Set --config.data.train_files='corpus/*.txt' for your own text (one sentence
per line, blank line between documents).
BERT's two-phase recipe (90% of the steps at 128 tokens / 20 predictions,
the rest at 512 / 80; docs/scaling-and-tpu.md, "Two phases in one run"):
  --config.train.recipe=bert_two_phase --config.train.num_steps=1000000
"""

from bert_jax import config_lib


def get_config():
  return config_lib.get_config("base")
