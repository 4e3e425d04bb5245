"""ALBERT (Lan et al. 2020) as a configuration of the shared BERT blocks.

Factorized embeddings (``model.embedding_size`` E, tables from the shared
:class:`model.Embeddings`, projected to H by ``embeddings_project``) and cross-layer sharing as in Hugging Face
``AlbertConfig``: ``num_hidden_layers`` applications of ``num_hidden_groups``
groups of ``inner_group_num`` :class:`model.Layer` blocks each; layer i uses
group ``i * num_hidden_groups // num_hidden_layers``. The published setting
(1 group of 1 layer) holds ONE block's parameters, applied by a loop over the
same weights, so its gradient is the sum over all uses. Heads: the MLM head
maps H -> E before the decoder tied to the E-wide word table; SOP is a 2-way
classifier on the pooled [CLS].
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
from flax import nnx

from bert_jax.models import attention as attention_lib
from bert_jax.models import bert
from bert_jax.models import layers as layers_lib


class AlbertGroup(nnx.Module):
  """`inner_group_num` blocks applied in order (HF AlbertLayerGroup)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    self.layers = nnx.List([bert.Layer(config, rngs=rngs)
                            for _ in range(config.inner_group_num)])


class AlbertModel(nnx.Module):
  """Embeddings (E -> H), the shared groups, and the pooler."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    bert.validate_model_config(config)
    self.embeddings = bert.Embeddings(config, rngs=rngs)
    self.embeddings_project = bert.embeddings_projection(config, rngs)
    self.groups = nnx.List([AlbertGroup(config, rngs=rngs)
                            for _ in range(config.num_hidden_groups)])
    self.pooler = layers_lib.Dense(config, config.hidden_size,
                                  config.hidden_size, ("embed", None),
                                  rngs=rngs)
    self.num_layers = int(config.num_hidden_layers)
    self.remat_policy = config.remat_policy

  def group_of_layer(self, i: int) -> int:
    return i * len(self.groups) // self.num_layers

  def __call__(self, input_ids, input_mask, segment_ids, *,
               deterministic=True, rngs=None, sequence_ids=None,
               position_ids=None, cls_positions=None):
    """Returns (sequence_output [B,T,H], pooled_output [B,H], or [B,S,H]
    for packed rows, as model.BertModel)."""
    x = self.embeddings(input_ids, segment_ids, deterministic=deterministic,
                        rngs=rngs, position_ids=position_ids)
    if self.embeddings_project is not None:
      x = self.embeddings_project(x)
    mask = attention_lib.make_mask(input_mask, sequence_ids)
    for i in range(self.num_layers):
      for layer in self.groups[self.group_of_layer(i)].layers:
        x = bert.apply_layer(layer, x, mask, self.remat_policy,
                                  deterministic=deterministic, rngs=rngs)
    return x, bert.pool(self.pooler, x, cls_positions=cls_positions)


class AlbertForPreTraining(nnx.Module):
  """ALBERT with the MLM and SOP heads (HF ``AlbertForPreTraining``)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    self.albert = AlbertModel(config, rngs=rngs)
    self.mlm_head = bert.MaskedLMHead(config, rngs=rngs)
    self.sop_dropout = nnx.Dropout(config.classifier_dropout_prob)
    self.sop_head = layers_lib.Dense(config, config.hidden_size, 2,
                                    ("embed", "classes"), rngs=rngs)

  def __call__(self, input_ids, input_mask, segment_ids,
               masked_lm_positions=None, *, deterministic=True, rngs=None,
               sequence_ids=None, position_ids=None, cls_positions=None):
    """Returns dict(mlm_logits, nsp_logits, sequence_output, pooled_output)
    like BertForPreTraining (nsp_logits are the sentence-order logits)."""
    seq, pooled = self.albert(input_ids, input_mask, segment_ids,
                              deterministic=deterministic, rngs=rngs,
                              sequence_ids=sequence_ids,
                              position_ids=position_ids,
                              cls_positions=cls_positions)
    mlm_logits = self.mlm_head(
        bert.gather_positions(seq, masked_lm_positions),
        self.albert.embeddings.word_embeddings[...])
    h = self.sop_dropout(pooled, deterministic=deterministic, rngs=rngs)
    sop_logits = (h @ self.sop_head.kernel[...] + self.sop_head.bias[...])
    return dict(mlm_logits=mlm_logits, nsp_logits=sop_logits.astype(
        jnp.float32), sequence_output=seq, pooled_output=pooled)
