"""Any encoder with a task head: the one model class of every fine-tuning run.

A task kind (``bert_jax/tasks/``) says what its head reads and how many
outputs it has; an encoder family (``bert_jax/families/``) says, once, how
its Hugging Face task classes put a head on its encoder (a
:class:`HeadLayout`). :class:`TaskModel` composes the two, so any family's
encoder carries any kind's head without a class per pair:

  pooled  one vector per example ([CLS] through the encoder's pooler, or
          pooled tokens through the family's transform) -> dropout -> output
  token   every token (through the family's transform) -> dropout -> output
  span    every token (through the family's transform) [-> dropout] ->
          output of 2 (answer start, end)
  embed   one vector per example, the tokens pooled (``model
          .embedding_pooling``: mean over real tokens (also for "") or
          [CLS]), optionally
          L2-normalised (``model.embedding_normalize``); no output layer, no
          pooler, no transform: a sentence embedding on the bare encoder
          (sentence-transformers' Pooling and Normalize)

Parameter names: the encoder under the family's attribute (``bert``,
``model``), the transform as ``head``, the output under the kind's name
(``classifier``, ``qa_outputs``); the family's table gives their Hugging
Face names. Outputs are float32 (inputs cast up, float32 matmul), whatever
the compute dtype.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax.numpy as jnp
from flax import nnx

from bert_jax.models import layers

POOLED, TOKEN, SPAN, EMBED = "pooled", "token", "span", "embed"
ROLES = (POOLED, TOKEN, SPAN, EMBED)
POOLINGS = ("cls", "mean")


@dataclasses.dataclass(frozen=True)
class HeadLayout:
  """How a family's Hugging Face task classes sit on its encoder."""
  # The encoder's own pooler (dense + this activation on [CLS]) gives a
  # pooled role its vector: BERT's tanh, the activation of ELECTRA's (gelu)
  # and DistilBERT's (relu) classification heads. None: no pooler; the
  # tokens are pooled (model.classifier_pooling, "cls" or "mean") and go
  # through `transform` (ModernBERT).
  pooler_act: str | None = "tanh"
  # (model_config, rngs) -> a module applied before the output, stored as
  # ``head`` (ModernBERT's prediction head: dense, activation, norm).
  transform: Callable | None = None
  # The model config field of the dropout before the output, and the roles
  # that have it (BERT's question-answering head has none).
  dropout_field: str = "hidden_dropout_prob"
  dropout_roles: tuple[str, ...] = (POOLED, TOKEN)
  # (model_config) -> the initializer of output kernels; None: BERT's
  # N(0, initializer_range).
  output_init: Callable | None = None
  # (model_config) -> training FLOPs of the transform on one vector
  # (forward + backward).
  transform_flops: Callable = lambda model_config: 0.0


def pool_tokens(seq, input_mask, mode: str, sequence_ids=None,
                cls_positions=None):
  """One vector per example from token states [B, T, d]: the first token
  ("cls") or the mean over real tokens ("mean"). Packed rows (sequence ids
  [B, T], 0 = padding, and cls_positions [B, S]) give [B, S, d], one per
  packed sequence; padded rows [B, d]."""
  if cls_positions is None:
    if mode == "cls":
      return seq[:, 0]
    m = (input_mask > 0).astype(seq.dtype)[..., None]
    return jnp.sum(seq * m, axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1)
  if mode == "cls":
    return jnp.take_along_axis(seq, cls_positions[..., None], axis=1)
  slots = cls_positions.shape[-1]
  which = (sequence_ids[..., None] == jnp.arange(1, slots + 1)).astype(
      seq.dtype)  # [B, T, S]
  sums = jnp.einsum("bts,btd->bsd", which, seq)
  return sums / jnp.maximum(jnp.sum(which, axis=1), 1)[..., None]


def embedding(seq, input_mask, pooling: str, normalize: bool,
              sequence_ids=None, cls_positions=None):
  """Sentence vectors in float32 from token states: :func:`pool_tokens`,
  then, with `normalize`, divided by their L2 norm (at least 1e-12, as
  torch's ``F.normalize``). The floor is taken under the square root, so a
  zero vector (a packed row's empty slot) has a zero gradient, not
  0 x inf = NaN."""
  h = pool_tokens(seq.astype(jnp.float32), input_mask, pooling, sequence_ids,
                  cls_positions)
  if normalize:
    squared = jnp.sum(h * h, axis=-1, keepdims=True)
    h = h / jnp.sqrt(jnp.maximum(squared, 1e-24))
  return h


class EncoderModel(nnx.Module):
  """An encoder alone under `encoder_attr` (a family's ``{Prefix}Model``
  tree, e.g. ``bert.*``): its call returns (token states, pooled or
  None)."""

  def __init__(self, config, *, encoder_attr: str, make_encoder: Callable,
               rngs: nnx.Rngs, pooler: bool = False):
    self.encoder_attr = encoder_attr
    # What readers of the encoder's states need to know of its input.
    self.max_positions = int(config.max_position_embeddings)
    self.hidden_size = int(config.hidden_size)
    setattr(self, encoder_attr, make_encoder(config, rngs, pooler=pooler))

  @property
  def encoder(self):
    return getattr(self, self.encoder_attr)

  def __call__(self, *args, **kwargs):
    return self.encoder(*args, **kwargs)


class TaskModel(nnx.Module):
  """An encoder (``make_encoder(config, rngs, pooler)`` -> a module whose
  call returns (token states, pooled or None)) under `encoder_attr`, with
  a head of `role` and `outputs` outputs named `output_name`, laid out as
  `layout` says."""

  def __init__(self, config, *, encoder_attr: str, make_encoder: Callable,
               layout: HeadLayout, role: str, outputs: int, output_name: str,
               rngs: nnx.Rngs):
    if role not in ROLES:
      raise ValueError(f"A head's role is one of {ROLES}, not {role!r}.")
    self.role, self.encoder_attr, self.output_name = (role, encoder_attr,
                                                      output_name)
    self.use_pooler = role == POOLED and layout.pooler_act is not None
    setattr(self, encoder_attr,
            make_encoder(config, rngs, pooler=self.use_pooler))
    if role == EMBED:  # The pooled vector itself: nothing after the encoder.
      self.head, self.pooling = None, config.embedding_pooling or "mean"
      self.normalize = bool(config.embedding_normalize)
      return
    self.head = (layout.transform(config, rngs)
                 if layout.transform is not None else None)
    rate = (float(config[layout.dropout_field])
            if role in layout.dropout_roles else 0.0)
    self.dropout = nnx.Dropout(rate)
    init = (layout.output_init(config) if layout.output_init is not None
            else None)
    setattr(self, output_name, layers.Dense(
        config, config.hidden_size, int(outputs), ("embed", "classes"),
        rngs=rngs, init=init))
    self.pooling = config.get("classifier_pooling", "cls")

  @property
  def encoder(self):
    return getattr(self, self.encoder_attr)

  def __call__(self, input_ids, input_mask, segment_ids=None, *,
               deterministic=True, rngs=None, sequence_ids=None,
               position_ids=None, cls_positions=None):
    """Logits in float32: [B, outputs] for a pooled role ([B, S, outputs]
    for packed rows, one per packed example at its `cls_positions`), else
    [B, T, outputs]; the embed role's vectors [B, d] ([B, S, d])."""
    # A pooler's head reads the pooled output alone: the encoder's last
    # layer then runs at [CLS] only (models.bert.BertModel's pooled_only,
    # every encoder with a pooler).
    only = dict(pooled_only=True) if self.use_pooler else {}
    seq, pooled = self.encoder(
        input_ids, input_mask, segment_ids, deterministic=deterministic,
        rngs=rngs, sequence_ids=sequence_ids, position_ids=position_ids,
        cls_positions=cls_positions if self.use_pooler else None, **only)
    if self.role == EMBED:
      return embedding(seq, input_mask, self.pooling, self.normalize,
                       sequence_ids, cls_positions)
    if self.role == POOLED:
      h = pooled if self.use_pooler else pool_tokens(
          seq, input_mask, self.pooling, sequence_ids, cls_positions)
    else:
      h = seq
    if self.head is not None:
      h = self.head(h)
    h = self.dropout(h, deterministic=deterministic, rngs=rngs)
    out = getattr(self, self.output_name)
    return (jnp.einsum("...d,dc->...c", h.astype(jnp.float32),
                       out.kernel[...]) + out.bias[...]).astype(jnp.float32)
