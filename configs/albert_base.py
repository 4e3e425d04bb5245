"""ALBERT-base (Lan et al. 2020): E=128, H=768, 12 shared layers, 12 heads,
FFN 3072, vocab 30,000: 11,813,810 parameters as HF AlbertForPreTraining.

Published recipe: LAMB, lr 0.00176, batch 4096, 125k steps, seq 512, SOP,
n-gram masking (spans of up to 3 words), no dropout (ALBERT v2).
Run (demo corpus, tokenizer trained and cached in the workdir):
  python -m bert_jax.main --config configs/albert_base.py --workdir /tmp/albert
Shrink for a CPU smoke run, e.g. --config.train.batch_size=16
--config.data.seq_length=128 --config.train.num_steps=30.
Export: tools/convert_to_hf.py writes AlbertForPreTraining (bert_jax.hf_albert).
"""

from bert_jax import config_lib


def albert_config(layers: int, hidden: int, heads: int, ffn: int):
  config = config_lib.get_config("base")
  config.objective.name = "albert"
  config.model.update(
      vocab_size=30000, embedding_size=128, hidden_size=hidden,
      num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=ffn, hidden_act="gelu_new", hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0, num_hidden_groups=1,
      inner_group_num=1)
  config.data.update(objective="sop", nsp=True, max_ngram=3,
                     whole_word_mask=True, seq_length=512,
                     max_predictions_per_seq=20)
  config.train.update(optimizer="lamb", learning_rate=0.00176,
                      batch_size=4096, num_steps=125_000, warmup_steps=3125,
                      weight_decay=0.01, adam_eps=1e-6)
  return config


def get_config():
  return albert_config(layers=12, hidden=768, heads=12, ffn=3072)
