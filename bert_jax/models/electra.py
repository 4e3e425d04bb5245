"""ELECTRA's generator and discriminator (Clark et al. 2020) in Flax NNX.

Built from ``models/bert.py``'s blocks, as google-research/electra builds them:
one :class:`~bert_jax.models.bert.Embeddings` (token, position and segment
tables and their LayerNorm, width E = ``model.embedding_size``) shared by both
networks; each network is an :class:`~bert_jax.models.bert.Encoder` with its own
``embeddings_project`` (E -> its hidden size, present only when they differ)
and layer stack. The generator is a small BERT MLM (hidden size a fraction of
the discriminator's, ``objective.generator_hidden_size``) whose head maps to E
and decodes with the shared word embeddings; the discriminator's head is
dense H -> H, GELU, dense H -> 1 (HF ``discriminator_predictions``).

Parameter tree (``families/electra.py`` maps it to ``ElectraForPreTraining`` and
``ElectraForMaskedLM``)::

  embeddings/...                             shared by both networks
  generator/encoder/{embeddings_project?, layers/i/...}
  generator/mlm_head/{transform, layer_norm, bias}
  discriminator/encoder/{embeddings_project?, layers/i/...}
  discriminator/head/{dense, dense_prediction}

Everything under ``generator/`` is the generator's own; the discriminator's
loss can reach it only through the sampled tokens, which are integers (no
gradient), so it trains on the MLM loss alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from bert_jax.models import bert
from bert_jax.models import layers as layers_lib


def generator_config(config: ml_collections.ConfigDict
                     ) -> ml_collections.ConfigDict:
  """The generator's model config: the discriminator's (``config.model``)
  with hidden size, depth, heads and FFN from ``config.objective``.

  As google-research/electra ``get_generator_config``: hidden =
  round(H * generator_hidden_size), layers = round(L * generator_layers),
  heads = max(1, hidden // 64), intermediate = 4 * hidden, unless
  ``generator_num_attention_heads`` / ``generator_intermediate_size`` are set
  (> 0), e.g. to match an imported Hugging Face generator.
  """
  obj, disc = config.objective, config.model
  gen = ml_collections.ConfigDict(disc.to_dict())
  frac = float(obj.generator_hidden_size)
  if not 0.0 < frac <= 1.0:
    raise ValueError(f"objective.generator_hidden_size={frac} must be a "
                     "fraction of model.hidden_size in (0, 1].")
  gen.hidden_size = int(round(disc.hidden_size * frac))
  gen.num_hidden_layers = max(1, int(round(
      disc.num_hidden_layers * float(obj.generator_layers))))
  gen.num_attention_heads = int(obj.generator_num_attention_heads
                                or max(1, gen.hidden_size // 64))
  gen.intermediate_size = int(obj.generator_intermediate_size
                              or 4 * gen.hidden_size)
  gen.embedding_size = bert.embedding_size(disc)
  if gen.hidden_size % gen.num_attention_heads:
    raise ValueError(
        f"The generator's hidden size {gen.hidden_size} (model.hidden_size="
        f"{disc.hidden_size} x objective.generator_hidden_size={frac}) is not "
        f"divisible by its {gen.num_attention_heads} heads: set "
        "objective.generator_num_attention_heads.")
  return gen


class Generator(nnx.Module):
  """Encoder + MLM head decoding with the shared word embeddings."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    self.encoder = bert.Encoder(config, rngs=rngs)
    self.mlm_head = bert.MaskedLMHead(config, rngs=rngs)

  def __call__(self, embedded, input_mask, word_embeddings, positions=None, *,
               deterministic=True, rngs=None, sequence_ids=None):
    """MLM logits [B,P,V] at `positions` [B,P] (or [B,T,V] everywhere);
    packed rows pass their `sequence_ids`."""
    seq = self.encoder(embedded, input_mask, deterministic=deterministic,
                       rngs=rngs, sequence_ids=sequence_ids)
    if positions is not None:
      seq = jnp.take_along_axis(seq, positions[..., None], axis=1)
    return self.mlm_head(seq, word_embeddings)


class DiscriminatorHead(nnx.Module):
  """Dense H -> H, GELU, dense H -> 1: one replaced-token logit per token."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    h = config.hidden_size
    self.dense = layers_lib.Dense(config, h, h, ("embed", None), rngs=rngs)
    self.dense_prediction = layers_lib.Dense(config, h, 1, ("embed", "classes"),
                                            rngs=rngs)

  def __call__(self, x):
    h = layers_lib.gelu(self.dense(x))
    return self.dense_prediction(h)[..., 0].astype(jnp.float32)


class Discriminator(nnx.Module):
  def __init__(self, config, *, rngs: nnx.Rngs):
    self.encoder = bert.Encoder(config, rngs=rngs)
    self.head = DiscriminatorHead(config, rngs=rngs)

  def __call__(self, embedded, input_mask, *, deterministic=True, rngs=None):
    """Replaced-token logits [B,T] (float32)."""
    return self.head(self.encoder(embedded, input_mask,
                                  deterministic=deterministic, rngs=rngs))


class ElectraForPreTraining(nnx.Module):
  """Shared embeddings, a generator and a discriminator (all trainable params).

  `config` is the full run config (``model`` = the discriminator,
  ``objective`` = generator size).
  """

  def __init__(self, config: ml_collections.ConfigDict, *, rngs: nnx.Rngs):
    bert.validate_model_config(config.model)
    self.embeddings = bert.Embeddings(config.model, rngs=rngs)
    self.generator = Generator(generator_config(config), rngs=rngs)
    self.discriminator = Discriminator(config.model, rngs=rngs)

  def generator_logits(self, input_ids, input_mask, segment_ids,
                       positions=None, *, deterministic=True, rngs=None):
    """MLM logits of the generator ([B,P,V] at `positions`, else [B,T,V])."""
    x = self.embeddings(input_ids, segment_ids, deterministic=deterministic,
                        rngs=rngs)
    return self.generator(x, input_mask, self.embeddings.word_embeddings[...],
                          positions, deterministic=deterministic, rngs=rngs)

  def discriminator_logits(self, input_ids, input_mask, segment_ids, *,
                           deterministic=True, rngs=None):
    """Replaced-token logits [B,T] of the discriminator."""
    x = self.embeddings(input_ids, segment_ids, deterministic=deterministic,
                        rngs=rngs)
    return self.discriminator(x, input_mask, deterministic=deterministic,
                              rngs=rngs)


def count_params(model: ElectraForPreTraining) -> dict[str, int]:
  """{"shared", "generator", "discriminator", "total"} parameter counts."""
  state = nnx.state(model, nnx.Param).to_pure_dict()
  size = lambda t: sum(int(x.size) for x in jax.tree.leaves(t))
  out = {"shared": size(state["embeddings"]),
         "generator": size(state["generator"]),
         "discriminator": size(state["discriminator"])}
  out["total"] = sum(out.values())
  return out


class ElectraDiscriminatorModel(nnx.Module):
  """The discriminator alone, as Hugging Face ``ElectraForPreTraining``:
  embeddings + discriminator (the same subtrees as in the pair). `config` is
  the discriminator's model config (``model``)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    self.embeddings = bert.Embeddings(config, rngs=rngs)
    self.discriminator = Discriminator(config, rngs=rngs)

  def __call__(self, input_ids, input_mask, segment_ids):
    x = self.embeddings(input_ids, segment_ids, deterministic=True, rngs=None)
    return self.discriminator(x, input_mask)


class ElectraGeneratorModel(nnx.Module):
  """The generator alone, as Hugging Face ``ElectraForMaskedLM``. `config` is
  the generator's model config (:func:`generator_config`)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    self.embeddings = bert.Embeddings(config, rngs=rngs)
    self.generator = Generator(config, rngs=rngs)

  def __call__(self, input_ids, input_mask, segment_ids, positions=None, *,
               deterministic=True, sequence_ids=None, position_ids=None):
    """dict(mlm_logits=[B,P,V] or [B,T,V]), as BertForPreTraining's, so
    that fill-mask runs either (packed rows too)."""
    del deterministic  # Inference only.
    x = self.embeddings(input_ids, segment_ids, deterministic=True, rngs=None,
                        position_ids=position_ids)
    return dict(mlm_logits=self.generator(
        x, input_mask, self.embeddings.word_embeddings[...], positions,
        sequence_ids=sequence_ids))
