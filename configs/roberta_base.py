"""RoBERTa-base (Liu et al. 2019): BERT-base's 12 x 768 encoder with
positions counted from the padding id (a 514-row table, id 1 = <pad>), one
token type, no NSP head; 124,697,433 parameters as Hugging Face
RobertaForMaskedLM with its 50,265-token vocabulary. Recipe: full sentences
(data.nsp=False), 15% dynamic masking, 512 tokens, 8k sequences a step, lr
6e-4 with 24k warmup steps, Adam betas 0.9 / 0.98, eps 1e-6, weight decay
0.01, 500k steps.

Continued pretraining of a Hugging Face RoBERTa directory (its config.json
and tokenizer.json decide the architecture and the vocabulary;
docs/continued-pretraining.md):
  python -m bert_jax.main --config configs/roberta_base.py \\
    --workdir /tmp/rb --config.train.init_from=/path/to/roberta-base \\
    --config.data.sources='corpus/*.txt' --config.train.batch_size=32 \\
    --config.data.seq_length=128 --config.data.max_predictions_per_seq=20
Export: python -m bert_jax.to_hf --workdir /tmp/rb --output /tmp/rb_hf
"""

from bert_jax.objectives import roberta


def get_config():
  return roberta.published_config("base")
