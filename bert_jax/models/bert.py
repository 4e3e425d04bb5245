"""The BERT encoder of Devlin et al. 2019 in Flax NNX, with pretraining heads.

The module tree mirrors Hugging Face ``BertForPreTraining`` one to one
(``bert.embeddings.word_embeddings`` <-> ``embeddings.word_embeddings`` ...),
so conversion is a renaming plus a transpose of dense kernels (see ``hf/mapping.py``).
Parameters carry logical axis names only; ``training/sharding.py`` maps them
to a mesh.

Numerics: parameters are float32; matmul inputs are cast to
``model.dtype`` and accumulate in float32 (on this CPU's AMX and on TPU/GPU
that is the fast path); softmax, LayerNorm and logits run in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from bert_jax.models import attention as attention_lib
from bert_jax.models import logical
from bert_jax.models.attention import ATTENTION_IMPLS
from bert_jax.models.attention import SelfAttention
from bert_jax.models.layers import ACTIVATIONS
from bert_jax.models.layers import POOLER_ACTIVATIONS
from bert_jax.models.layers import REMAT_POLICIES
from bert_jax.models.layers import Dense
from bert_jax.models.layers import LayerNorm
from bert_jax.models.layers import compute_dtype
from bert_jax.models.layers import normal_init
from bert_jax.models.layers import zeros_init


def embedding_size(config: ml_collections.ConfigDict) -> int:
  """E: width of the embedding tables (HF ``embedding_size``; 0/None = H).

  When E != hidden_size the embeddings are factorized (ELECTRA-Small, ALBERT):
  tables of width E and a projection E -> H at the encoder's input.
  """
  return int(config.embedding_size or config.hidden_size)


class Embeddings(nnx.Module):
  """Token + position + segment embeddings, summed, LayerNorm, dropout.

  Width E = :func:`embedding_size` (the hidden size unless factorized); the
  projection to the hidden size belongs to the :class:`Encoder` that reads
  them, so that two encoders of different widths can share one table
  (ELECTRA's generator and discriminator).
  With model.type_vocab_size 0 there is no segment table (DistilBERT); with
  1 every token is of type 0 (RoBERTa: a pair's second segment too, as its
  tokenizers give).
  Positions are 0..T-1, or `position_ids` [B, T] (packed rows restart them
  at 0 in each sequence); with model.positions_from_pad (RoBERTa, XLM-R)
  they start at model.pad_token_id + 1 (:func:`position_ids_from_pad`).
  """

  def __init__(self, config, *, rngs: nnx.Rngs):
    d = embedding_size(config)
    self.word_embeddings = nnx.Param(normal_init(config, ("vocab", "embed"))(
        rngs.params(), (config.vocab_size, d)))
    self.position_embeddings = nnx.Param(normal_init(config, ("position", "embed"))(
        rngs.params(), (config.max_position_embeddings, d)))
    self.token_type_embeddings = nnx.Param(normal_init(config, ("type", "embed"))(
        rngs.params(), (config.type_vocab_size, d))
    ) if config.type_vocab_size else None
    self.layer_norm = LayerNorm(config, d, rngs=rngs)
    self.dropout = nnx.Dropout(config.hidden_dropout_prob)
    self.dtype = compute_dtype(config)
    self.pad_id = (int(config.pad_token_id) if config.positions_from_pad
                   else None)

  def __call__(self, input_ids, segment_ids, *, deterministic, rngs,
               position_ids=None):
    seq_len = input_ids.shape[-1]
    # Gather the fsdp-split embed dim first: a lookup in a table split on
    # its output dim makes XLA replicate the whole result ("involuntary full
    # rematerialization") to reach the batch-split activation layout.
    table = logical.constrain(self.word_embeddings[...], ("vocab", None))
    x = jnp.take(table, input_ids, axis=0)
    if self.pad_id is not None:
      position_ids = position_ids_from_pad(input_ids, self.pad_id,
                                           position_ids)
    if position_ids is None:
      x = x + self.position_embeddings[...][:seq_len][None]
    else:
      x = x + jnp.take(self.position_embeddings[...], position_ids, axis=0)
    if self.token_type_embeddings is not None:
      if segment_ids is None or self.token_type_embeddings.shape[0] == 1:
        # One segment, as HF's token_type_ids default (one type: RoBERTa).
        segment_ids = jnp.zeros_like(input_ids)
      types = logical.constrain(self.token_type_embeddings[...],
                                ("type", None))
      x = x + jnp.take(types, segment_ids, axis=0)
    x = logical.constrain(x, ("activation_batch", "activation_length",
                              "activation_embed"))
    x = self.layer_norm(x)
    return self.dropout(x, deterministic=deterministic, rngs=rngs)


def position_offset(config) -> int:
  """How far positions are shifted into the table: model.pad_token_id + 1
  with model.positions_from_pad (RoBERTa, XLM-R), else 0."""
  return int(config.pad_token_id) + 1 if config.positions_from_pad else 0


def position_ids_from_pad(input_ids, pad_id: int, position_ids=None):
  """RoBERTa's position ids [B, T]: tokens that are not `pad_id` count
  pad_id + 1, pad_id + 2, ... and padding takes pad_id, as Hugging Face's
  ``create_position_ids_from_input_ids``; packed rows (`position_ids` given,
  restarting at 0 in each sequence) are shifted by pad_id + 1."""
  real = (input_ids != pad_id).astype(jnp.int32)
  if position_ids is None:
    position_ids = jnp.cumsum(real, axis=-1) - 1
  return jnp.where(real > 0, position_ids + pad_id + 1, pad_id)


class FeedForward(nnx.Module):
  """Dense -> GELU -> Dense, post-LN residual (BertIntermediate + BertOutput)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    d, f = config.hidden_size, config.intermediate_size
    self.intermediate = Dense(config, d, f, ("embed", "mlp"), rngs=rngs)
    self.output = Dense(config, f, d, ("mlp", "embed"), rngs=rngs)
    self.layer_norm = LayerNorm(config, d, rngs=rngs)
    self.dropout = nnx.Dropout(config.hidden_dropout_prob)
    self.act = ACTIVATIONS[config.hidden_act]

  def __call__(self, x, *, deterministic, rngs):
    h = self.act(self.intermediate(x))
    h = logical.constrain(h, ("activation_batch", "activation_length",
                              "activation_mlp"))
    out = self.dropout(self.output(h), deterministic=deterministic, rngs=rngs)
    return self.layer_norm(out + x)


class Layer(nnx.Module):
  """One post-LN transformer block (BertLayer)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    self.attention = SelfAttention(config, rngs=rngs)
    self.feed_forward = FeedForward(config, rngs=rngs)

  def __call__(self, x, mask, *, deterministic, rngs, queries_at=None):
    """x [B,T,H]; mask: an `attention.AttentionMask` (padded or packed).
    With `queries_at` [B,S] the block's output at those positions alone,
    [B,S,H] (see `SelfAttention`)."""
    x = self.attention(x, mask, deterministic=deterministic, rngs=rngs,
                       queries_at=queries_at)
    x = self.feed_forward(x, deterministic=deterministic, rngs=rngs)
    return logical.constrain(x, ("activation_batch", "activation_length",
                                 "activation_embed"))


def apply_layer(layer, x, mask, policy: str, *, deterministic, rngs,
                queries_at=None):
  """One block, rematerialized per `model.remat_policy` ("none": stored).
  `queries_at` (a :class:`Layer`'s, see there) is passed only when given:
  other families' blocks run through here too."""
  at = {} if queries_at is None else dict(queries_at=queries_at)
  if policy == "none":
    return layer(x, mask, deterministic=deterministic, rngs=rngs, **at)
  # Recompute the block in the backward pass (activation memory).
  return nnx.remat(
      lambda l, x, m, r, at: l(x, m, deterministic=deterministic, rngs=r,
                               **at),
      policy=REMAT_POLICIES[policy])(layer, x, mask, rngs, at)


def cls_states(x, cls_positions=None):
  """[B,T,H] at each sequence's [CLS]: position 0 -> [B,H], or the packed
  rows' `cls_positions` [B,S] -> [B,S,H]."""
  if cls_positions is None:
    return x[:, 0]
  return jnp.take_along_axis(x, cls_positions[..., None], axis=1)


def pool(pooler, x, act: str = "tanh", cls_positions=None):
  """Dense + activation (``model.pooler_act``; BERT's tanh) on the [CLS]
  position(s), in float32 ([B,H] or [B,S,H])."""
  return pooler_output(pooler, cls_states(x, cls_positions), act)


def pooler_output(pooler, cls, act: str = "tanh"):
  """Dense + activation on the [CLS] states `cls` ([B,H] or [B,S,H]), in
  float32."""
  return POOLER_ACTIVATIONS[act](pooler(cls).astype(jnp.float32))


def run_layers(layers, x, mask, remat_policy: str, *, deterministic, rngs,
               read_at=None):
  """The transformer stack, each block optionally rematerialized. With
  `read_at` [B,S] the caller reads the last block's output at those
  positions alone: that block computes only them ([B,S,H])."""
  for i, layer in enumerate(layers):
    x = apply_layer(layer, x, mask, remat_policy,
                    deterministic=deterministic, rngs=rngs,
                    queries_at=read_at if i == len(layers) - 1 else None)
  return x


class EmbeddingsProjection(Dense):
  """The E -> H dense after factorized embeddings (ELECTRA, ALBERT).

  A Dense (same parameter names: ``embeddings_project/{kernel,bias}``) whose
  output is constrained to the activation layout, so every encoder that
  projects shards its hidden states the same way.
  """

  def __call__(self, x):
    return logical.constrain(super().__call__(x), (
        "activation_batch", "activation_length", "activation_embed"))


def embeddings_projection(config, rngs: nnx.Rngs):
  """The one place the projection is built: an EmbeddingsProjection when
  ``model.embedding_size`` E differs from H, else None (BERT)."""
  e, h = embedding_size(config), config.hidden_size
  if e == h:
    return None
  return EmbeddingsProjection(config, e, h, (None, "embed"), rngs=rngs)


class Encoder(nnx.Module):
  """Embedded input [B,T,E] -> hidden states [B,T,H]: an optional
  ``embeddings_project`` (E -> H, only when E != H) and the layer stack.

  The building block of encoders that read someone else's embeddings
  (ELECTRA's generator and discriminator share one :class:`Embeddings`).
  """

  def __init__(self, config, *, rngs: nnx.Rngs):
    validate_model_config(config)
    self.embeddings_project = embeddings_projection(config, rngs)
    self.layers = nnx.List(
        [Layer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
    self.remat_policy = config.remat_policy

  def __call__(self, x, input_mask, *, deterministic=True, rngs=None,
               sequence_ids=None):
    if self.embeddings_project is not None:
      x = self.embeddings_project(x)
    return run_layers(self.layers, x,
                      attention_lib.make_mask(input_mask, sequence_ids),
                      self.remat_policy, deterministic=deterministic,
                      rngs=rngs)


def check_unfactorized(config) -> None:
  """BERT pretraining and its Hugging Face layout have no E -> H projection."""
  if embedding_size(config) != config.hidden_size:
    raise ValueError(
        f"model.embedding_size={config.embedding_size} != model.hidden_size="
        f"{config.hidden_size}: BERT has no embedding projection; set "
        "model.embedding_size=0 (factorized embeddings are for ELECTRA).")


class BertModel(nnx.Module):
  """Embeddings, encoder stack and pooler (dense + ``model.pooler_act``,
  BERT's tanh, on [CLS]).

  With E != H (``model.embedding_size``) an ``embeddings_project`` E -> H
  follows the embeddings: the encoder of a fine-tuned ELECTRA discriminator
  or ALBERT. The pretraining models below keep BERT's E == H.
  """

  def __init__(self, config, *, rngs: nnx.Rngs, add_pooling_layer=True):
    validate_model_config(config)
    self.embeddings = Embeddings(config, rngs=rngs)
    self.embeddings_project = embeddings_projection(config, rngs)
    self.layers = nnx.List(
        [Layer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
    self.remat_policy = config.remat_policy
    self.pooler = Dense(config, config.hidden_size, config.hidden_size,
                        ("embed", None), rngs=rngs) if add_pooling_layer else None
    self.pooler_act = config.pooler_act

  def __call__(self, input_ids, input_mask, segment_ids, *,
               deterministic=True, rngs=None, sequence_ids=None,
               position_ids=None, cls_positions=None, pooled_only=False):
    """Returns (sequence_output [B,T,d], pooled_output or None).

    Packed rows pass `sequence_ids` and `position_ids` [B,T] (attention
    stays inside each sequence) and `cls_positions` [B,S] (the pooled output
    is then [B,S,d], one per packed sequence); padded rows pass none.

    `pooled_only`: the caller reads the pooled output alone (a sentence
    head), so the last layer computes its states at the [CLS] positions
    only -- their queries against every key, then the output projection and
    feed-forward on those positions -- the same numbers for 1/L of the
    stack's per-token work less. sequence_output is then the last layer at
    [CLS]: [B,1,d], or [B,S,d] for packed rows.
    """
    x = self.embeddings(input_ids, segment_ids, deterministic=deterministic,
                        rngs=rngs, position_ids=position_ids)
    if self.embeddings_project is not None:
      x = self.embeddings_project(x)
    read_at = None
    if pooled_only:
      if self.pooler is None:
        raise ValueError("pooled_only needs the pooler (add_pooling_layer).")
      read_at = (cls_positions if cls_positions is not None else
                 jnp.zeros((x.shape[0], 1), jnp.int32))
    x = run_layers(self.layers, x,
                   attention_lib.make_mask(input_mask, sequence_ids),
                   self.remat_policy, deterministic=deterministic, rngs=rngs,
                   read_at=read_at)
    if self.pooler is None:
      return x, None
    if read_at is None:
      cls = cls_states(x, cls_positions)
    else:  # The last layer ran at [CLS] alone.
      cls = x if cls_positions is not None else x[:, 0]
    return x, pooler_output(self.pooler, cls, self.pooler_act)

  def hidden_states(self, input_ids, input_mask, segment_ids,
                    num_layers: int | None = None, *, sequence_ids=None,
                    position_ids=None) -> list:
    """Inference only: [embeddings output, layer 1, ..., layer n] ([B,T,d]).

    Indexed like Hugging Face's ``output_hidden_states`` (0 = embeddings).
    `num_layers` stops after that many blocks, so an intermediate layer
    costs only the blocks below it. Packed rows pass `sequence_ids` and
    `position_ids`, as to the call.
    """
    n = len(self.layers) if num_layers is None else num_layers
    x = self.embeddings(input_ids, segment_ids, deterministic=True, rngs=None,
                        position_ids=position_ids)
    if self.embeddings_project is not None:
      x = self.embeddings_project(x)
    mask = attention_lib.make_mask(input_mask, sequence_ids)
    states = [x]
    for layer in list(self.layers)[:n]:
      x = layer(x, mask, deterministic=True, rngs=None)
      states.append(x)
    return states


class MaskedLMHead(nnx.Module):
  """Dense + GELU + LayerNorm, then the decoder tied to the word embeddings.

  The transform maps the hidden size H to the embedding width E (equal for
  BERT; ELECTRA's generator maps its small H to the shared E; ALBERT's H to
  its factorized E).
  """

  def __init__(self, config, *, rngs: nnx.Rngs):
    h, e = config.hidden_size, embedding_size(config)
    self.transform = Dense(config, h, e, ("embed", None), rngs=rngs)
    self.layer_norm = LayerNorm(config, e, rngs=rngs)
    self.bias = nnx.Param(zeros_init(("vocab",))(rngs.params(),
                                             (config.vocab_size,)))
    self.dtype = compute_dtype(config)
    self.act = ACTIVATIONS[config.hidden_act]

  def __call__(self, x, word_embeddings):
    h = self.layer_norm(self.act(self.transform(x)))
    logits = jnp.einsum("...d,vd->...v", h, word_embeddings.astype(self.dtype),
                        preferred_element_type=jnp.float32)
    return logits + self.bias[...]


class BertForPreTraining(nnx.Module):
  """BERT with the MLM and NSP heads (HF ``BertForPreTraining``)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    check_unfactorized(config)
    self.bert = BertModel(config, rngs=rngs)
    self.mlm_head = MaskedLMHead(config, rngs=rngs)
    self.nsp_head = Dense(config, config.hidden_size, 2, ("embed", "classes"),
                          rngs=rngs)

  def __call__(self, input_ids, input_mask, segment_ids,
               masked_lm_positions=None, *, deterministic=True, rngs=None,
               sequence_ids=None, position_ids=None, cls_positions=None):
    """Returns dict(mlm_logits, nsp_logits, sequence_output, pooled_output).

    With `masked_lm_positions` [B,P], MLM logits are computed only at those
    positions ([B,P,V]); without, at every position ([B,T,V]). Packed rows
    (see BertModel) get nsp_logits [B,S,2], one per packed pair.
    """
    seq, pooled = self.bert(input_ids, input_mask, segment_ids,
                            deterministic=deterministic, rngs=rngs,
                            sequence_ids=sequence_ids,
                            position_ids=position_ids,
                            cls_positions=cls_positions)
    if masked_lm_positions is not None:
      seq_for_mlm = jnp.take_along_axis(seq, masked_lm_positions[..., None],
                                        axis=1)
    else:
      seq_for_mlm = seq
    mlm_logits = self.mlm_head(seq_for_mlm,
                               self.bert.embeddings.word_embeddings[...])
    nsp_logits = (pooled @ self.nsp_head.kernel[...]
                  + self.nsp_head.bias[...])
    return dict(mlm_logits=mlm_logits, nsp_logits=nsp_logits,
                sequence_output=seq, pooled_output=pooled)


def gather_positions(seq, positions):
  """[B,T,d] at [B,P] positions -> [B,P,d]; all of `seq` when None."""
  if positions is None:
    return seq
  return jnp.take_along_axis(seq, positions[..., None], axis=1)


class BertForMaskedLM(nnx.Module):
  """Encoder without pooler plus the tied MLM head (HF ``BertForMaskedLM``;
  with type_vocab_size=0 it is the layout of ``DistilBertForMaskedLM``)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    check_unfactorized(config)
    self.bert = BertModel(config, rngs=rngs, add_pooling_layer=False)
    self.mlm_head = MaskedLMHead(config, rngs=rngs)

  def __call__(self, input_ids, input_mask, segment_ids,
               masked_lm_positions=None, *, deterministic=True, rngs=None,
               sequence_ids=None, position_ids=None):
    """Returns dict(mlm_logits, sequence_output), as BertForPreTraining."""
    seq, _ = self.bert(input_ids, input_mask, segment_ids,
                       deterministic=deterministic, rngs=rngs,
                       sequence_ids=sequence_ids, position_ids=position_ids)
    mlm_logits = self.mlm_head(gather_positions(seq, masked_lm_positions),
                               self.bert.embeddings.word_embeddings[...])
    return dict(mlm_logits=mlm_logits, sequence_output=seq)


def validate_model_config(config: ml_collections.ConfigDict) -> None:
  """Raise one clear ValueError for an inconsistent model config."""
  if config.hidden_size % config.num_attention_heads:
    raise ValueError(
        f"model.hidden_size={config.hidden_size} is not divisible by "
        f"model.num_attention_heads={config.num_attention_heads}.")
  if config.attention_impl not in ATTENTION_IMPLS:
    raise ValueError(f"model.attention_impl={config.attention_impl!r} must be "
                     f"one of {ATTENTION_IMPLS}.")
  remat = config.remat_policy
  if remat != "none" and remat not in REMAT_POLICIES:
    raise ValueError(f"model.remat_policy={remat!r} must be 'none' or one of "
                     f"{tuple(REMAT_POLICIES)}.")
  if config.pooler_act not in POOLER_ACTIVATIONS:
    raise ValueError(f"model.pooler_act={config.pooler_act!r} must be one of "
                     f"{tuple(POOLER_ACTIVATIONS)}.")
  if config.hidden_act not in ACTIVATIONS:
    raise ValueError(f"model.hidden_act={config.hidden_act!r} is not supported;"
                     f" use one of {tuple(ACTIVATIONS)} ('gelu' is BERT's exact"
                     " erf GELU, 'gelu_new' ALBERT's tanh approximation).")
  for field in ("vocab_size", "hidden_size", "num_hidden_layers",
                "intermediate_size", "max_position_embeddings"):
    if int(config[field]) <= 0:
      raise ValueError(f"model.{field}={config[field]} must be positive.")
  if int(config.type_vocab_size) < 0 or int(config.embedding_size) < 0:
    raise ValueError(
        f"model.type_vocab_size={config.type_vocab_size} and "
        f"model.embedding_size={config.embedding_size} must be >= 0 "
        "(0: no segment table / tables as wide as hidden_size).")
  if config.positions_from_pad and not (
      0 <= int(config.pad_token_id) < min(int(config.vocab_size),
                                          int(config.max_position_embeddings) - 1)):
    raise ValueError(
        f"model.pad_token_id={config.pad_token_id} must be a token id below "
        f"model.vocab_size={config.vocab_size} and leave positions after it "
        f"(model.max_position_embeddings={config.max_position_embeddings}): "
        "with model.positions_from_pad positions start at pad_token_id + 1.")
  groups, layers = int(config.num_hidden_groups), int(config.num_hidden_layers)
  if groups < 1 or layers % groups or int(config.inner_group_num) < 1:
    raise ValueError(
        f"model.num_hidden_groups={groups} must be >= 1 and divide "
        f"model.num_hidden_layers={layers}; model.inner_group_num="
        f"{config.inner_group_num} must be >= 1.")


def count_params(model: nnx.Module) -> int:
  """Number of parameters (the tied MLM decoder is the embedding: counted once)."""
  state = nnx.state(model, nnx.Param)
  return sum(int(x.size) for x in jax.tree.leaves(state))
