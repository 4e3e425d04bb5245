"""ModernBERT-large (Warner et al. 2024): 28 x 1024, 16 heads, GeGLU 2,624,
vocabulary 50,368, 128-token sliding window, global attention every third
layer; 395,881,664 parameters as Hugging Face ModernBertForMaskedLM
(394,781,696 without the head). Recipe as configs/modernbert_base.py with
peak learning rate 5e-4.

Run (demo corpus unless data.sources is set):
  python -m bert_jax.main --config configs/modernbert_large.py \
    --workdir /tmp/mbl --config.train.num_steps=10 \
    --config.train.batch_size=4 --config.data.seq_length=128 \
    --config.data.max_predictions_per_seq=39
"""

from bert_jax.objectives import modernbert


def get_config():
  config = modernbert.published_config("large")
  t = config.train
  t.num_steps = 100_000
  t.batch_size = 4928  # Sequences per step (ModernBERT-large).
  # 3B tokens at 4,928 x 1,024 per step.
  t.warmup_steps = 594
  t.decay_steps = 0
  config.checkpoint.save_every_steps = 1000
  return config
