"""Rotary position embeddings (Su et al. 2021), in the layout of
Hugging Face's Llama / ModernBERT: the head dimension split in halves
(``rotate_half``), not interleaved pairs.

For a head of size D and angle theta_j = pos * base^(-2j/D), j < D/2:

  q' = q * cos + rotate_half(q) * sin,   rotate_half([a, b]) = [-b, a]

with cos / sin of the angles repeated over both halves. Positions come per
token ([B, T] ints), so packed rows restart them per segment; the tables
are computed in float32 and the rotation runs in float32 whatever the
compute dtype (as HF does), the result cast back.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def inverse_frequencies(head_dim: int, base: float) -> np.ndarray:
  """base^(-2j/D) for j < D/2, float32, in Hugging Face's order of
  operations and dtypes (ModernBERT's ``compute_default_rope_parameters``:
  ``1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))``):
  the exponent 2j/D in float32, the power rounded to float32, its
  reciprocal in float32. The power is computed in float64 and rounded once
  (correctly rounded); torch's vectorized float32 pow equals it on
  ModernBERT's tables (head size 64, bases 160,000 and 10,000) and is 1-2
  ulp off on a few entries of some others."""
  if head_dim % 2:
    raise ValueError(f"Rotary embeddings need an even head size, got "
                     f"{head_dim} (model.hidden_size / "
                     "model.num_attention_heads).")
  exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(
      head_dim)
  powers = np.power(np.float64(np.float32(base)),
                    exponents.astype(np.float64)).astype(np.float32)
  return np.float32(1.0) / powers


def tables(positions: jax.Array, head_dim: int,
           base: float) -> tuple[jax.Array, jax.Array]:
  """[B, T] positions -> (cos, sin), each [B, T, 1, D] float32 (a head axis
  of 1 to broadcast over [B, T, H, D] projections)."""
  inv = jnp.asarray(inverse_frequencies(head_dim, base))
  angles = positions.astype(jnp.float32)[..., None] * inv  # [B, T, D/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
  return jnp.cos(angles), jnp.sin(angles)


def rotate_half(x: jax.Array) -> jax.Array:
  half = x.shape[-1] // 2
  return jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def apply(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
  """Rotates [B, T, H, D] `x` by the tables; float32 inside, x.dtype out."""
  x32 = x.astype(jnp.float32)
  return (x32 * cos + rotate_half(x32) * sin).astype(x.dtype)
