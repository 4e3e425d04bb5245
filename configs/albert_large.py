"""ALBERT-large (Lan et al. 2020): E=128, H=1024, 24 shared layers, 16
heads, FFN 4096, vocab 30,000: 17,847,474 parameters as HF
AlbertForPreTraining. Recipe as configs/albert_base.py (LAMB, lr 0.00176,
batch 4096, SOP, n-gram masking).
Run:
  python -m bert_jax.main --config configs/albert_large.py --workdir /tmp/albert_l
"""

from bert_jax.objectives import albert


def get_config():
  return albert.published_config(layers=24, hidden=1024, heads=16, ffn=4096)
