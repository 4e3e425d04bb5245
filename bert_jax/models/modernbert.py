"""ModernBERT (Warner et al. 2024) in Flax NNX, equal to Hugging Face's
``ModernBertModel`` and ``ModernBertForMaskedLM``; its task classes are the
encoder with a ``models.heads.TaskModel`` head in ModernBERT's layout (the
prediction head before the classifier, ``families/modernbert.py``).

  token embeddings -> LayerNorm -> L pre-norm blocks -> final LayerNorm
  block i:  x += Attention(LN(x))   (no LN before the first block, as HF)
            x += Wo(act(a) * g), [a, g] = Wi(LN(x))   (GeGLU)
  MLM head: dense -> act -> LN -> decoder tied to the token embeddings,
            with a bias of its own

No biases anywhere except the decoder's (and a classifier's); LayerNorms
without bias (``norm_bias=False``); rotary positions with theta
model.global_rope_theta on the global layers (0, n, 2n, ...) and
model.local_rope_theta on the sliding-window ones (``rope_attention.py``).
No position or segment tables: ``segment_ids`` is accepted and ignored, so
the objectives' and tools' calls read like BERT's. Packed rows
(``data.packing``) pass ``position_ids`` and ``sequence_ids`` (0 = padding):
RoPE reads the positions, restarting per document, and the attention mask
(``attention.make_mask``, built once a forward pass) keeps each document to
itself, combined with the sliding window on the local layers; by default
positions count from 0 and the mask is the padding's.

Initialization as HF's ``_init_weights``: truncated normals (cut at 2 std)
of std initializer_range for embeddings, Wqkv and Wi, and
initializer_range / sqrt(2 L) for both output projections and the head's
dense; hidden_size**-0.5 for a classifier (:func:`classifier_init`). The
module tree mirrors HF's names (``families/modernbert.py`` renames
``attn.Wqkv`` <-> ``attn.wqkv``).
"""

from __future__ import annotations

import jax.numpy as jnp
import ml_collections
from flax import nnx

from bert_jax.models import attention as attention_lib
from bert_jax.models import heads
from bert_jax.models import logical
from bert_jax.models import rope_attention
from bert_jax.models.bert import gather_positions
from bert_jax.models.bert import run_layers
from bert_jax.models.layers import ACTIVATIONS
from bert_jax.models.layers import Dense
from bert_jax.models.layers import LayerNorm
from bert_jax.models.layers import compute_dtype
from bert_jax.models.layers import truncated_normal_init
from bert_jax.models.layers import zeros_init

CUTOFF = 2.0  # HF initializer_cutoff_factor.
POOLINGS = heads.POOLINGS
ATTENTION_IMPLS = ("xla", "dot_product_attention", "cudnn", "splash")
_ACTIVATION = ("activation_batch", "activation_length", "activation_embed")


def _std(config, kind: str) -> float:
  std = float(config.initializer_range)
  return {"in": std, "out": std / (2.0 * config.num_hidden_layers) ** 0.5,
          "final": config.hidden_size ** -0.5}[kind]


def _norm(config, *, rngs):
  return LayerNorm(config, config.hidden_size, rngs=rngs, use_bias=False)


class Embeddings(nnx.Module):
  """Token embeddings, LayerNorm, dropout (HF ``ModernBertEmbeddings``)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    self.tok_embeddings = nnx.Param(truncated_normal_init(
        _std(config, "in"), CUTOFF, ("vocab", "embed"))(
            rngs.params(), (config.vocab_size, config.hidden_size)))
    self.norm = _norm(config, rngs=rngs)
    self.dropout = nnx.Dropout(config.hidden_dropout_prob)

  def __call__(self, input_ids, *, deterministic, rngs):
    # The fsdp-split embed dim gathered before the lookup (see bert.py).
    table = logical.constrain(self.tok_embeddings[...], ("vocab", None))
    x = logical.constrain(jnp.take(table, input_ids, axis=0), _ACTIVATION)
    return self.dropout(self.norm(x), deterministic=deterministic, rngs=rngs)


class GeGLU(nnx.Module):
  """Wi to 2 x intermediate, act(first half) * second half, Wo (HF
  ``ModernBertMLP``; dropout model.hidden_dropout_prob = HF mlp_dropout)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    d, f = config.hidden_size, config.intermediate_size
    # [d, 2, f]: (input, gate) on their own axis, f split by "mlp".
    self.wi = nnx.Param(truncated_normal_init(
        _std(config, "in"), CUTOFF, ("embed", None, "mlp"))(
            rngs.params(), (d, 2, f)))
    self.wo = Dense(config, f, d, ("mlp", "embed"), rngs=rngs,
                    use_bias=False, init=truncated_normal_init(
                        _std(config, "out"), CUTOFF, ("mlp", "embed")))
    self.act = ACTIVATIONS[config.hidden_act]
    self.dropout = nnx.Dropout(config.hidden_dropout_prob)
    self.dtype = compute_dtype(config)

  def __call__(self, x, *, deterministic, rngs):
    y = jnp.einsum("bti,ijo->btjo", x.astype(self.dtype),
                   self.wi[...].astype(self.dtype),
                   preferred_element_type=jnp.float32).astype(self.dtype)
    h = self.act(y[:, :, 0]) * y[:, :, 1]
    h = logical.constrain(h, ("activation_batch", "activation_length",
                              "activation_mlp"))
    h = self.dropout(h, deterministic=deterministic, rngs=rngs)
    return self.wo(h)


class Layer(nnx.Module):
  """One pre-norm block (HF ``ModernBertEncoderLayer``)."""

  def __init__(self, config, index: int, *, rngs: nnx.Rngs):
    self.is_global = rope_attention.is_global_layer(config, index)
    self.attn_norm = None if index == 0 else _norm(config, rngs=rngs)
    self.attn = rope_attention.Attention(config, is_global=self.is_global,
                                         rngs=rngs)
    self.mlp_norm = _norm(config, rngs=rngs)
    self.mlp = GeGLU(config, rngs=rngs)

  def __call__(self, x, context, *, deterministic, rngs):
    """`context`: (positions [B, T], attention.AttentionMask)."""
    positions, mask = context
    h = x if self.attn_norm is None else self.attn_norm(x)
    x = x + self.attn(h, positions, mask,
                      deterministic=deterministic, rngs=rngs)
    x = x + self.mlp(self.mlp_norm(x), deterministic=deterministic,
                     rngs=rngs)
    return logical.constrain(x, _ACTIVATION)


def _context(input_ids, input_mask, position_ids, sequence_ids):
  """(positions [B, T], attention mask): packed rows' own position ids and
  sequence ids (``attention.make_mask``), else 0..T-1 and the padding."""
  if position_ids is None:
    position_ids = jnp.broadcast_to(jnp.arange(input_ids.shape[-1]),
                                    input_ids.shape)
  return (position_ids.astype(jnp.int32),
          attention_lib.make_mask(input_mask, sequence_ids))


class ModernBertModel(nnx.Module):
  """Embeddings, blocks and final norm (HF ``ModernBertModel``)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    validate_model_config(config)
    self.embeddings = Embeddings(config, rngs=rngs)
    self.layers = nnx.List([Layer(config, i, rngs=rngs)
                            for i in range(config.num_hidden_layers)])
    self.final_norm = _norm(config, rngs=rngs)
    self.remat_policy = config.remat_policy
    self.max_positions = int(config.max_position_embeddings)

  def __call__(self, input_ids, input_mask, segment_ids=None, *,
               position_ids=None, sequence_ids=None, cls_positions=None,
               deterministic=True, rngs=None):
    """-> (last hidden state [B, T, d] after the final norm, None): an
    encoder's (token states, pooled output), with no pooler. Segment ids
    and [CLS] positions are not read (no segment embeddings, no pooler)."""
    del segment_ids, cls_positions
    x = self.embeddings(input_ids, deterministic=deterministic, rngs=rngs)
    context = _context(input_ids, input_mask, position_ids, sequence_ids)
    x = run_layers(self.layers, x, context, self.remat_policy,
                   deterministic=deterministic, rngs=rngs)
    return self.final_norm(x), None

  def hidden_states(self, input_ids, input_mask, segment_ids=None,
                    num_layers: int | None = None, *, sequence_ids=None,
                    position_ids=None) -> list:
    """Inference only, indexed as HF's ``output_hidden_states``: 0 is the
    embeddings output, i the residual stream after block i, and the last
    (all L blocks run) has the final norm applied, as HF's does. Packed
    rows pass `sequence_ids` and `position_ids`, as to the call."""
    del segment_ids
    n = len(self.layers) if num_layers is None else num_layers
    x = self.embeddings(input_ids, deterministic=True, rngs=None)
    context = _context(input_ids, input_mask, position_ids, sequence_ids)
    states = [x]
    for layer in list(self.layers)[:n]:
      x = layer(x, context, deterministic=True, rngs=None)
      states.append(x)
    if n == len(self.layers):
      states[-1] = self.final_norm(x)
    return states

  @property
  def word_embeddings(self):
    return self.embeddings.tok_embeddings


class PredictionHead(nnx.Module):
  """Dense (no bias) -> activation -> LayerNorm (HF
  ``ModernBertPredictionHead``; the MLM head's and a classifier's)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    d = config.hidden_size
    self.dense = Dense(config, d, d, ("embed", None), rngs=rngs,
                       use_bias=False, init=truncated_normal_init(
                           _std(config, "out"), CUTOFF, ("embed", None)))
    self.norm = _norm(config, rngs=rngs)
    self.act = ACTIVATIONS[config.hidden_act]

  def __call__(self, x):
    return self.norm(self.act(self.dense(x)))


class Decoder(nnx.Module):
  """Logits: the token embeddings transposed (tied) plus a bias of its own
  (HF ``decoder``, ``decoder_bias=True``), in float32."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    self.bias = nnx.Param(zeros_init(("vocab",))(rngs.params(),
                                                 (config.vocab_size,)))
    self.dtype = compute_dtype(config)

  def __call__(self, h, embeddings):
    logits = jnp.einsum("...d,vd->...v", h, embeddings.astype(self.dtype),
                        preferred_element_type=jnp.float32)
    return logits + self.bias[...]


class ModernBertForMaskedLM(nnx.Module):
  """Encoder, head and tied decoder (HF ``ModernBertForMaskedLM``)."""

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    self.model = ModernBertModel(config, rngs=rngs)
    self.head = PredictionHead(config, rngs=rngs)
    self.decoder = Decoder(config, rngs=rngs)

  def __call__(self, input_ids, input_mask, segment_ids=None,
               masked_lm_positions=None, *, position_ids=None,
               sequence_ids=None, cls_positions=None, deterministic=True,
               rngs=None):
    """Returns dict(mlm_logits, sequence_output); logits at the
    `masked_lm_positions` [B, P] only (HF's sparse prediction), else at
    every position. Packed rows' `cls_positions` are not read (no
    sentence-pair head)."""
    del cls_positions
    seq, _ = self.model(input_ids, input_mask, position_ids=position_ids,
                        sequence_ids=sequence_ids, deterministic=deterministic,
                        rngs=rngs)
    h = self.head(gather_positions(seq, masked_lm_positions))
    return dict(mlm_logits=self.decoder(h, self.model.word_embeddings[...]),
                sequence_output=seq)


def classifier_init(config):
  """A task head's output kernel: N(0, hidden_size**-0.5) cut at 2 std
  (HF ``_init_weights`` of ``classifier``)."""
  return truncated_normal_init(_std(config, "final"), CUTOFF,
                               ("embed", "classes"))


def validate_model_config(config: ml_collections.ConfigDict) -> None:
  """One clear ValueError for a model config ModernBERT cannot build."""
  d, h = int(config.hidden_size), int(config.num_attention_heads)
  if d % h or (d // h) % 2:
    raise ValueError(
        f"model.hidden_size={d} must be a multiple of "
        f"model.num_attention_heads={h} with an even head size (rotary "
        "embeddings rotate pairs).")
  if config.attention_impl not in ATTENTION_IMPLS:
    raise ValueError(f"model.attention_impl={config.attention_impl!r} must "
                     f"be one of {ATTENTION_IMPLS}.")
  if config.hidden_act not in ACTIVATIONS:
    raise ValueError(f"model.hidden_act={config.hidden_act!r} is not one of "
                     f"{tuple(ACTIVATIONS)}.")
  window = int(config.local_attention)
  if window < 2 or window % 2:
    raise ValueError(f"model.local_attention={window} must be an even "
                     "window of >= 2 tokens (half on each side; 128 in "
                     "ModernBERT).")
  if int(config.global_attn_every_n_layers) < 1:
    raise ValueError(f"model.global_attn_every_n_layers="
                     f"{config.global_attn_every_n_layers} must be >= 1.")
  for field in ("global_rope_theta", "local_rope_theta"):
    if float(config[field]) <= 1.0:
      raise ValueError(f"model.{field}={config[field]} must be > 1.")
  if config.classifier_pooling not in POOLINGS:
    raise ValueError(f"model.classifier_pooling={config.classifier_pooling!r}"
                     f" must be one of {POOLINGS}.")
  for field in ("vocab_size", "num_hidden_layers", "intermediate_size",
                "max_position_embeddings"):
    if int(config[field]) <= 0:
      raise ValueError(f"model.{field}={config[field]} must be positive.")
