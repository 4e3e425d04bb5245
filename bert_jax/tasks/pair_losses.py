"""Contrastive and ranking losses over a whole batch of sentence vectors.

Pure functions of the vectors of a GLOBAL batch: under ``jit`` with the
batch sharded over the mesh, each similarity matrix is one sharded matmul
and every anchor sees every other example's texts as negatives, whatever
the number of devices (the same batch gives the same loss on 1 and 8).

Vectors are ``[B, K, d]``: per example its texts in order (anchor,
positive, hard negatives; or sentence1, sentence2). Similarities are
cosines times ``scale`` (sentence-transformers' ``cos_sim``, vectors
divided by max(norm, 1e-12)).

  info_nce   in-batch negatives (sentence-transformers'
             ``MultipleNegativesRankingLoss``; ``symmetric``: its
             ``directions=("query_to_doc", "doc_to_query")``,
             ``partition_mode="per_direction"``): per anchor the cross
             entropy of its positive among every positive and hard negative
             of the batch. A candidate that is a copy of the anchor or of
             its positive, or another positive of the same anchor text, is
             no negative and is left out (``text_ids``: equal ids, equal
             texts), so duplicate texts in a batch never push an anchor
             away from its own meaning.
  cosent     CoSENT (``CoSENTLoss``): log(1 + sum over pairs i, j with
             score_i < score_j of exp(s_i - s_j)); one value per batch.
  matryoshka either, summed over prefixes of the vectors (``MatryoshkaLoss``
             with weights 1).

Rows of weight 0 (padding of an eval batch) take no part: no loss as
anchors, no candidates.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

_MASKED = -1e9  # A logit that is exp() -> 0 against any cosine * scale.


def unit(x):
  """x / max(||x||, 1e-12) along the last axis (torch F.normalize)."""
  norm = jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True))
  return x / jnp.maximum(norm, 1e-12)


def info_nce(vectors, weights, text_ids, *, scale: float,
             symmetric: bool = False):
  """(sum over real anchors of their loss, number of real anchors).

  `vectors` [B, K, d] (K >= 2), `weights` [B] (0: a padding row),
  `text_ids` [B, K] int (equal ids: equal texts; -1: an empty slot).
  """
  vectors = unit(vectors.astype(jnp.float32))
  b, k, d = vectors.shape
  real = weights > 0
  anchors, docs = vectors[:, 0], vectors[:, 1:]  # [B, d], [B, K-1, d]
  # Candidates in sentence-transformers' order: every positive, then every
  # first hard negative, ...: column c = slot (c // B) + 1 of row c % B.
  cands = jnp.swapaxes(docs, 0, 1).reshape((k - 1) * b, d)
  cand_ids = jnp.swapaxes(text_ids[:, 1:], 0, 1).reshape(-1)
  cand_row = jnp.tile(jnp.arange(b), k - 1)
  cand_is_positive = jnp.arange((k - 1) * b) < b
  own = cand_row[None, :] == jnp.arange(b)[:, None]  # [B, C]
  anchor_ids, positive_ids = text_ids[:, :1], text_ids[:, 1:2]
  copy = ((cand_ids[None, :] == positive_ids) |
          (cand_ids[None, :] == anchor_ids) |
          (cand_is_positive[None, :] &
           (anchor_ids[cand_row][:, 0][None, :] == anchor_ids)))
  positive = own & cand_is_positive[None, :]
  keep = (real[cand_row] & (cand_ids >= 0))[None, :] & (positive | ~copy)
  scores = jnp.where(keep, scale * anchors @ cands.T, _MASKED)  # [B, C]
  pos = jnp.sum(jnp.where(positive, scores, 0.0), axis=1)
  log_z = jax.nn.logsumexp(scores, axis=1)
  if symmetric:  # Each positive against every anchor of the batch.
    back = scale * docs[:, 0] @ anchors.T  # [B (doc), B (anchor)]
    same = jnp.eye(b, dtype=bool)
    # Anchor i is a copy for positive j: the same anchor text, the
    # positive's own text, or an anchor of the same positive text.
    copy = ((text_ids[:, None, 0] == text_ids[None, :, 0]) |
            (text_ids[:, None, 1] == text_ids[None, :, 0]) |
            (text_ids[:, None, 1] == text_ids[None, :, 1]))
    keep = real[None, :] & (same | ~copy)
    log_z = (log_z + jax.nn.logsumexp(jnp.where(keep, back, _MASKED),
                                      axis=1)) / 2
  w = real.astype(jnp.float32)
  return jnp.sum(w * (log_z - pos)), jnp.sum(w)


def cosent(vectors, weights, scores, *, scale: float):
  """CoSENT of the batch's (sentence1, sentence2) cosines against their
  gold `scores` [B]: log(1 + sum_{score_i < score_j} exp(s_i - s_j))."""
  vectors = unit(vectors.astype(jnp.float32))
  s = scale * jnp.sum(vectors[:, 0] * vectors[:, 1], axis=-1)  # [B]
  real = weights > 0
  ordered = ((scores[:, None] < scores[None, :]) & real[:, None] &
             real[None, :])
  diffs = jnp.where(ordered, s[:, None] - s[None, :], _MASKED).reshape(-1)
  return jax.nn.logsumexp(jnp.concatenate([jnp.zeros((1,), diffs.dtype),
                                           diffs]))


def matryoshka(loss_fn, vectors, dims: Sequence[int]):
  """sum over `dims` of loss_fn(vectors[..., :dim]) (() = the whole
  vector once); loss_fn returns a scalar or a tuple whose first entry is
  summed (the rest taken from the whole vector's call)."""
  if not dims:
    return loss_fn(vectors)
  outs = [loss_fn(vectors[..., :int(d)]) for d in dims]
  if isinstance(outs[0], tuple):
    return (sum(o[0] for o in outs),) + tuple(outs[0][1:])
  return sum(outs)
