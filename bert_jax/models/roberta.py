"""RoBERTa (Liu et al. 2019) and XLM-R's masked LM: BERT's encoder with
positions counted from the padding id, and the tied LM head.

The encoder is ``bert.BertModel`` with ``model.positions_from_pad`` (a
token's position id is pad_token_id + 1 + its index among the row's
non-padding tokens) and one token type; there is no pooler and no
sentence-pair head. The LM head is BERT's (dense, GELU, LayerNorm, the
decoder tied to the word embeddings, its own bias). The module tree mirrors
Hugging Face ``RobertaForMaskedLM`` (``roberta.*``, ``lm_head.*``).
"""

from __future__ import annotations

import ml_collections
from flax import nnx

from bert_jax.models import bert


class RobertaForMaskedLM(nnx.Module):
  """Encoder without pooler plus the tied LM head (HF ``RobertaForMaskedLM``,
  ``XLMRobertaForMaskedLM``)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    bert.check_unfactorized(config)
    self.roberta = bert.BertModel(config, rngs=rngs, add_pooling_layer=False)
    self.lm_head = bert.MaskedLMHead(config, rngs=rngs)

  def __call__(self, input_ids, input_mask, segment_ids=None,
               masked_lm_positions=None, *, deterministic=True, rngs=None,
               sequence_ids=None, position_ids=None, cls_positions=None):
    """Returns dict(mlm_logits, sequence_output): logits at
    `masked_lm_positions` [B,P] ([B,P,V]), or at every position ([B,T,V])."""
    del cls_positions  # No sentence head reads <s>.
    seq, _ = self.roberta(input_ids, input_mask, segment_ids,
                          deterministic=deterministic, rngs=rngs,
                          sequence_ids=sequence_ids,
                          position_ids=position_ids)
    logits = self.lm_head(bert.gather_positions(seq, masked_lm_positions),
                          self.roberta.embeddings.word_embeddings[...])
    return dict(mlm_logits=logits, sequence_output=seq)
