"""Demo: pretrain BERT-mini (4x256) on CPython's bundled documentation text.

Run:
  python -m bert_jax.main --config configs/demo.py --workdir /tmp/bert_demo
Needs nothing downloaded: the corpus is `pydoc_data.topics` (79 documents of
English prose, ~465 KB) from the Python standard library; a SentencePiece
tokenizer of up to 4,000 pieces is trained on it and cached in the workdir.
Expected: final held-out MLM accuracy 0.096 against 0.037 for the unigram
baseline (always predicting the most frequent masked token), both printed
at the end, in about 7 minutes on 2 CPU cores (README.md, "What the demo
does and prints": the log, machine, commit and date).
"""

from bert_jax import config_lib


def get_config():
  config = config_lib.get_config("mini")
  config.model.vocab_size = 4000
  config.model.max_position_embeddings = 64
  # float32: on CPUs without AMX (e.g. AMD EPYC) bf16 matmuls are no faster
  # here (tools/benchmark.py measured fp32 1.15x bf16 for this config); use
  # "bfloat16" on TPU/GPU and AMX CPUs.
  config.model.dtype = "float32"
  config.data.tokenizer_vocab_size = 4000
  # Short sequences: per token, seq 64 ran 2.25x faster than 128 on 2 cores.
  config.data.seq_length = 64
  config.data.max_predictions_per_seq = 10
  config.train.num_steps = 500
  config.train.batch_size = 32
  config.train.learning_rate = 1e-3
  config.train.warmup_steps = 50
  config.train.log_every = 50
  config.train.eval_every = 100
  config.checkpoint.save_every_steps = 250
  return config
