"""Demo: pretrain BERT-mini (4x256) on CPython's bundled documentation text.

Run:
  python -m bert_jax.main --config configs/demo.py --workdir /tmp/bert_demo
Needs nothing downloaded: the corpus is `pydoc_data.topics` (79 documents of
English prose, ~465 KB) from the Python standard library; a 4,000-piece
SentencePiece tokenizer is trained on it and cached in the workdir.
Expected on 2 CPU cores: a few minutes; held-out MLM accuracy well above the
unigram baseline (always predicting the most frequent token), which is printed
next to it at the end.
"""

from bert_jax import config_lib


def get_config():
  config = config_lib.get_config("mini")
  config.model.vocab_size = 4000
  config.model.max_position_embeddings = 128
  config.model.dtype = "bfloat16"
  config.data.tokenizer_vocab_size = 4000
  config.data.seq_length = 128
  config.data.max_predictions_per_seq = 20
  config.train.num_steps = 400
  config.train.batch_size = 32
  config.train.learning_rate = 1e-3
  config.train.warmup_steps = 40
  config.train.log_every = 20
  config.train.eval_every = 100
  config.checkpoint.save_every_steps = 200
  return config
