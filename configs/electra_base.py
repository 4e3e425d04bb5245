"""ELECTRA-Base (Clark et al. 2020): 12 x 768 discriminator, embedding 768,
generator 1/3 of its width (256, 4 heads, FFN 1024: the released
electra-base-generator's shape); optimizer as google-research/electra's
Base settings (lr 2e-4, warmup 10k, weight decay 0.01, Adam eps 1e-6,
batch 256, seq 512, mask 15%: 85% [MASK], 15% unchanged).

Run (demo corpus unless data.sources is set):
  python -m bert_jax.main --config configs/electra_base.py --workdir /tmp/eb \
    --config.train.num_steps=20 --config.train.batch_size=8 \
    --config.data.seq_length=128 --config.data.max_predictions_per_seq=19
Published schedule: 766k steps (ELECTRA-Base GLUE dev 85.1). The learning
rate decays linearly from the end of warmup (TF: polynomial decay from step
0 times a warmup ramp) and AdamW has bias correction.
"""

from bert_jax import config_lib


def get_config():
  config = config_lib.get_config("base")  # 12 x 768, 12 heads, FFN 3072.
  config.objective.name = "electra"
  config.objective.generator_hidden_size = 1 / 3
  config.model.embedding_size = 768
  d = config.data
  d.seq_length = 512
  d.mask_rate = 0.15
  d.max_predictions_per_seq = 79  # int((0.15 + 0.005) * 512)
  d.mask_token_prob = 0.85
  d.random_token_prob = 0.0
  d.nsp = False
  t = config.train
  t.num_steps = 766_000
  t.batch_size = 256
  t.learning_rate = 2e-4
  t.warmup_steps = 10_000
  t.weight_decay = 0.01
  t.adam_b1, t.adam_b2, t.adam_eps = 0.9, 0.999, 1e-6
  t.max_grad_norm = 1.0
  config.checkpoint.save_every_steps = 1000
  return config
