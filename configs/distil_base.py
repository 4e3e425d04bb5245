"""DistilBERT (Sanh et al. 2019): a 6-layer student of a BERT-base teacher.

config.model is the teacher's architecture (BERT-base here); the student
has objective.student_layers=6 layers, no segment embeddings and no pooler
(66,985,530 parameters with the 30,522-token vocabulary, as HF
DistilBertForMaskedLM), initialized from teacher layers 0, 2, 4, 7, 9, 11.
Loss as published: 5.0 x soft-target CE (T=2) + 2.0 x MLM + 1.0 x cosine.
Run (the teacher: a workdir of ours, an imported or Hugging Face BERT dir):
  python -m bert_jax.main --config configs/distil_base.py \
      --config.objective.teacher=/path/to/bert --workdir /tmp/distil
The teacher's tokenizer must be the run's: set data.tokenizer_path (and
data.tokenizer_type) to the teacher's vocab.
"""

from bert_jax import config_lib


def get_config():
  config = config_lib.get_config("base")
  config.objective.update(name="distil", student_layers=6, temperature=2.0,
                          alpha_ce=5.0, alpha_mlm=2.0, alpha_cos=1.0)
  # RoBERTa-style packed sentences, no sentence-pair task (as DistilBERT).
  config.data.update(objective="packed", nsp=False)
  config.train.update(learning_rate=5e-4, warmup_steps=500, batch_size=256)
  return config
