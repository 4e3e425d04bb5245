"""ALBERT-base (Lan et al. 2020): E=128, H=768, 12 shared layers, 12 heads,
FFN 3072, vocab 30,000: 11,813,810 parameters as HF AlbertForPreTraining.

Published recipe: LAMB, lr 0.00176, batch 4096, 125k steps, seq 512, SOP,
n-gram masking (spans of up to 3 words), no dropout (ALBERT v2).
Run (demo corpus, tokenizer trained and cached in the workdir):
  python -m bert_jax.main --config configs/albert_base.py --workdir /tmp/albert
Shrink for a CPU smoke run, e.g. --config.train.batch_size=16
--config.data.seq_length=128 --config.train.num_steps=30.
Export: python -m bert_jax.to_hf writes AlbertForPreTraining (table:
bert_jax/families/albert.py).
"""

from bert_jax.objectives import albert


def get_config():
  return albert.published_config(layers=12, hidden=768, heads=12, ffn=3072)
