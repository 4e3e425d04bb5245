"""ModernBERT-base (Warner et al. 2024): 22 x 768, 12 heads, GeGLU 1,152,
vocabulary 50,368, a 128-token sliding window with global attention every
third layer; 149,655,232 parameters as Hugging Face ModernBertForMaskedLM
(149,014,272 without the head). Recipe: 30% masking, no NSP, StableAdamW
(lr 8e-4, betas 0.9/0.98, eps 1e-6, decoupled weight decay 1e-5),
warmup-stable-decay, 1,024 tokens with RoPE base 10,000, then (a second
phase) 8,192 tokens with the global layers' base at 160,000.

Run (demo corpus unless data.sources is set; the demo's tokenizer is far
smaller than 50,368, the table is padded):
  python -m bert_jax.main --config configs/modernbert_base.py \
    --workdir /tmp/mb --config.train.num_steps=20 \
    --config.train.batch_size=8 --config.data.seq_length=128 \
    --config.data.max_predictions_per_seq=39 --config.train.warmup_steps=2
With the context extension (steps at 1,024, then at 8,192 and theta 160k):
  --config.train.num_steps=1100 --config.train.phases="({'num_steps': 1000,
    'seq_length': 1024, 'max_predictions_per_seq': 308, 'batch_size': 8},
    {'num_steps': 100, 'seq_length': 8192, 'max_predictions_per_seq': 2458,
    'batch_size': 1, 'model': {'global_rope_theta': 160000.0}})"
  (objectives.modernbert.context_extension_phases builds the same tuple).
Published: 1.7T tokens at 1,024, then 250B at 8,192 and a decay. Export:
  python -m bert_jax.to_hf --workdir /tmp/mb --output /tmp/mb_hf
"""

from bert_jax.objectives import modernbert


def get_config():
  config = modernbert.published_config("base")
  t = config.train
  t.num_steps = 100_000
  t.batch_size = 4608  # Sequences per step (ModernBERT's global batch).
  t.warmup_steps = 636  # 3B tokens at 4,608 x 1,024 tokens per step.
  t.decay_steps = 0  # Constant to the end; decay in a later phase.
  config.checkpoint.save_every_steps = 1000
  return config
