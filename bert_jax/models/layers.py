"""The building blocks every encoder here shares: dense and LayerNorm layers
with logical axis names, activations, initializers, rematerialization.

Numerics: parameters are float32; matmul inputs are cast to the compute
dtype (``model.dtype``) and accumulate in float32; LayerNorm runs in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

# model.remat_policy -> jax.checkpoint policy ("none": no rematerialization).
REMAT_POLICIES = {
    "full": None,  # Save only block inputs; recompute everything.
    "dots": jax.checkpoint_policies.dots_saveable,
    "dots_no_batch": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}

def compute_dtype(config: ml_collections.ConfigDict):
  return jnp.dtype(config.dtype)


def normal_init(config, axes):
  return nnx.with_partitioning(
      nnx.initializers.normal(config.initializer_range), axes,
      eager_sharding=False)


def zeros_init(axes):
  return nnx.with_partitioning(nnx.initializers.zeros_init(), axes,
                               eager_sharding=False)


def ones_init(axes):
  return nnx.with_partitioning(nnx.initializers.ones_init(), axes,
                               eager_sharding=False)


def truncated_normal_init(std: float, cutoff: float, axes):
  """N(0, std) cut at +-cutoff * std (not rescaled), as torch's
  ``trunc_normal_(std=std, a=-cutoff * std, b=cutoff * std)``: ModernBERT's
  initialization."""
  def init(key, shape, dtype=jnp.float32):
    return std * jax.random.truncated_normal(key, -cutoff, cutoff, shape,
                                             dtype)
  return nnx.with_partitioning(init, axes, eager_sharding=False)


def matmul(x: jax.Array, w: jax.Array, dtype) -> jax.Array:
  """x @ w with inputs in `dtype` and float32 accumulation, result in `dtype`."""
  y = jnp.einsum("...i,io->...o", x.astype(dtype), w.astype(dtype),
                 preferred_element_type=jnp.float32)
  return y.astype(dtype)


class Dense(nnx.Module):
  """y = x W + b, kernel stored (in, out) like Flax; HF stores W transposed.

  `use_bias=False` leaves out b (ModernBERT); `init` replaces BERT's
  N(0, initializer_range) kernel initializer.
  """

  def __init__(self, config, in_features: int, out_features: int,
               axes: tuple, *, rngs: nnx.Rngs, use_bias: bool = True,
               init=None):
    init = init or normal_init(config, axes)
    self.kernel = nnx.Param(init(rngs.params(), (in_features, out_features)))
    self.bias = nnx.Param(zeros_init(axes[1:])(
        rngs.params(), (out_features,))) if use_bias else None
    self.dtype = compute_dtype(config)

  def __call__(self, x):
    y = matmul(x, self.kernel[...], self.dtype)
    if self.bias is None:
      return y
    return y + self.bias[...].astype(self.dtype)


class LayerNorm(nnx.Module):
  """LayerNorm computed in float32 (eps model.layer_norm_eps: 1e-12 as in
  BERT). `use_bias=False`: scale only (ModernBERT's ``norm_bias=False``)."""

  def __init__(self, config, features: int, *, rngs: nnx.Rngs,
               use_bias: bool = True):
    self.scale = nnx.Param(ones_init(("norm",))(rngs.params(), (features,)))
    self.bias = nnx.Param(zeros_init(("norm",))(
        rngs.params(), (features,))) if use_bias else None
    self.eps = config.layer_norm_eps
    self.dtype = compute_dtype(config)

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...]
    if self.bias is not None:
      y = y + self.bias[...]
    return y.astype(self.dtype)


def gelu(x):
  """Exact (erf) GELU, as in the original BERT."""
  return jax.nn.gelu(x, approximate=False)


# model.hidden_act -> function (Hugging Face names). ALBERT uses "gelu_new".
ACTIVATIONS = {
    "gelu": gelu,
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),  # tanh approx.
}
# model.pooler_act -> function: the pooler on [CLS] (BERT's tanh; the heads
# HF puts on fine-tuned ELECTRA (gelu) and DistilBERT (relu) encoders).
POOLER_ACTIVATIONS = {"tanh": jnp.tanh, "gelu": gelu, "relu": jax.nn.relu}
