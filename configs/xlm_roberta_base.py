"""XLM-R base (Conneau et al. 2020): RoBERTa-base's architecture with a
250,002-token SentencePiece vocabulary (<s> <pad> </s> <unk> first, <mask>
last), exported as XLMRobertaForMaskedLM; trained here with RoBERTa's
recipe (configs/roberta_base.py). Continued pretraining of a Hugging Face
XLM-R directory:
  python -m bert_jax.main --config configs/xlm_roberta_base.py \\
    --workdir /tmp/xr --config.train.init_from=/path/to/xlm-roberta-base \\
    --config.data.sources='corpus/*.txt'
"""

from bert_jax.objectives import roberta


def get_config():
  return roberta.published_config("base", "xlm-roberta")
