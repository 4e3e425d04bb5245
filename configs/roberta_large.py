"""RoBERTa-large (Liu et al. 2019): 24 x 1024, 16 heads, the 514-row
position table of RoBERTa-base; 355,412,057 parameters as Hugging Face
RobertaForMaskedLM; lr 4e-4 with 30k warmup steps, otherwise
configs/roberta_base.py's recipe (and its run and export commands).
"""

from bert_jax.objectives import roberta


def get_config():
  return roberta.published_config("large")
