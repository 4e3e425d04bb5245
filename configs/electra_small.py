"""ELECTRA-Small (Clark et al. 2020): 12 x 256 discriminator, embedding 128,
generator 1/4 of its width; optimizer as google-research/electra
``configure_pretraining.py`` (lr 5e-4, warmup 10k, weight decay 0.01, Adam
eps 1e-6, batch 128, seq 128, mask 15%: 85% [MASK], 15% unchanged).

Run (demo corpus unless data.sources is set):
  python -m bert_jax.main --config configs/electra_small.py --workdir /tmp/es \
    --config.train.num_steps=20 --config.train.batch_size=16
Published schedule: 1M steps (ELECTRA-Small GLUE dev 79.9 after 1M steps of
batch 128 on Wikipedia + BooksCorpus). Differences from the TF code: the
learning rate decays linearly from the end of warmup (TF: polynomial decay
from step 0 times a warmup ramp) and AdamW has bias correction.
The Hugging Face export is ``python -m bert_jax.to_hf`` (discriminator/ and
generator/ subdirectories).
"""

from bert_jax import config_lib


def get_config():
  config = config_lib.get_config("base")
  config.objective.name = "electra"
  config.objective.generator_hidden_size = 0.25
  m = config.model
  m.hidden_size = 256
  m.num_hidden_layers = 12
  m.num_attention_heads = 4
  m.intermediate_size = 1024
  m.embedding_size = 128
  d = config.data
  d.seq_length = 128
  d.mask_rate = 0.15
  # int((mask_prob + 0.005) * seq_length), as configure_pretraining.py.
  d.max_predictions_per_seq = 19
  d.mask_token_prob = 0.85  # ELECTRA: 85% [MASK], 15% left unchanged.
  d.random_token_prob = 0.0
  d.nsp = False  # No sentence-pair task: packed segments.
  t = config.train
  t.num_steps = 1_000_000
  t.batch_size = 128
  t.learning_rate = 5e-4
  t.warmup_steps = 10_000
  t.weight_decay = 0.01
  t.adam_b1, t.adam_b2, t.adam_eps = 0.9, 0.999, 1e-6
  t.max_grad_norm = 1.0
  config.checkpoint.save_every_steps = 1000
  return config
