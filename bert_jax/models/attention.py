"""Multi-head self-attention, in every kind ``model.attention_impl`` names.

"xla": explicit softmax (supports attention dropout); "dot_product_attention":
``jax.nn.dot_product_attention`` (cuDNN flash attention on GPU in bf16/fp16,
XLA elsewhere; "cudnn" forces it); "splash": the TPU Pallas kernel. Padding
enters as an additive bias of finite :data:`MASK_BIAS` on the keys.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.models import logical
from bert_jax.models import splash
from bert_jax.models.layers import Dense
from bert_jax.models.layers import LayerNorm
from bert_jax.models.layers import compute_dtype

# Added to attention scores at padded keys. Scores are float32, so this is
# finite and far below any real score; a fully padded row stays finite.
MASK_BIAS = -1e9


ATTENTION_IMPLS = ("xla", "dot_product_attention", "cudnn", "splash")



def attention_bias(input_mask):
  """[B,T] 1/0 mask -> [B,1,1,T] float32 bias added to attention scores."""
  return jnp.where(input_mask[:, None, None, :] > 0, 0.0,
                   MASK_BIAS).astype(jnp.float32)



class SelfAttention(nnx.Module):
  """Multi-head self-attention with biases, post-LN residual (BertAttention)."""

  def __init__(self, config, *, rngs: nnx.Rngs):
    d = config.hidden_size
    self.num_heads = config.num_attention_heads
    self.query = Dense(config, d, d, ("embed", "heads"), rngs=rngs)
    self.key = Dense(config, d, d, ("embed", "heads"), rngs=rngs)
    self.value = Dense(config, d, d, ("embed", "heads"), rngs=rngs)
    self.output = Dense(config, d, d, ("heads", "embed"), rngs=rngs)
    self.layer_norm = LayerNorm(config, d, rngs=rngs)
    self.attention_dropout = nnx.Dropout(config.attention_probs_dropout_prob)
    self.output_dropout = nnx.Dropout(config.hidden_dropout_prob)
    self.dtype = compute_dtype(config)
    self.attention_impl = config.attention_impl
    self.splash_interpret = bool(config.splash_interpret)
    self.fused_qkv = bool(config.fused_qkv)

  def _heads(self, x):
    b, t, d = x.shape
    x = x.reshape(b, t, self.num_heads, d // self.num_heads)
    return logical.constrain(x, ("activation_batch", "activation_length",
                                 "activation_heads", None))

  def _qkv(self, x):
    if not self.fused_qkv:
      return tuple(self._heads(f(x)) for f in (self.query, self.key,
                                                self.value))
    # One [d, 3, d] matmul instead of three [d, d]; params stay separate (HF
    # names). Stacked on a new axis so a "heads"-sharded dim stays local.
    w = jnp.stack([f.kernel[...] for f in (self.query, self.key, self.value)],
                  axis=1)
    b = jnp.stack([f.bias[...] for f in (self.query, self.key, self.value)])
    y = jnp.einsum("...i,ito->...to", x.astype(self.dtype),
                   w.astype(self.dtype), preferred_element_type=jnp.float32)
    y = y.astype(self.dtype) + b.astype(self.dtype)
    return tuple(self._heads(y[..., i, :]) for i in range(3))

  def __call__(self, x, mask_bias, *, deterministic, rngs):
    q, k, v = self._qkv(x)
    if self.attention_impl != "xla":
      ctx = self._fused_attention(q, k, v, mask_bias, deterministic)
      return self._output(ctx.reshape(x.shape), x, deterministic, rngs)
    head_dim = q.shape[-1]
    q = q * jnp.asarray(head_dim ** -0.5, q.dtype)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                        preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores + mask_bias, axis=-1)
    probs = self.attention_dropout(probs, deterministic=deterministic,
                                   rngs=rngs)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(self.dtype), v,
                     preferred_element_type=jnp.float32).astype(self.dtype)
    return self._output(ctx.reshape(x.shape), x, deterministic, rngs)

  def _fused_attention(self, q, k, v, mask_bias, deterministic):
    """dot_product_attention (cuDNN on GPU) or splash (TPU); no dropout."""
    if not deterministic and self.attention_dropout.rate > 0:
      raise ValueError(
          f"model.attention_impl={self.attention_impl!r} has no attention "
          "dropout: set model.attention_probs_dropout_prob=0 to train with it "
          "or use model.attention_impl='xla'.")
    impl = self.attention_impl
    if impl == "splash":
      return splash.attention(q, k, v, mask_bias[:, 0, 0, :] == 0,
                              interpret=self.splash_interpret)
    if impl == "dot_product_attention":
      impl = ("cudnn" if jax.default_backend() == "gpu"
              and self.dtype in (jnp.bfloat16, jnp.float16) else "xla")
    if impl == "cudnn":
      # cuDNN's flash kernel takes padding as lengths: BERT pads at the end.
      lengths = jnp.sum(mask_bias[:, 0, 0, :] == 0, axis=-1).astype(jnp.int32)
      return jax.nn.dot_product_attention(
          q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
          implementation="cudnn")
    # -1e9 overflows to -inf in float16: clamp to a finite value of q.dtype.
    bias = jnp.maximum(mask_bias, jnp.finfo(q.dtype).min / 2).astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias,
                                        implementation="xla")

  def _output(self, ctx, x, deterministic, rngs):
    out = self.output_dropout(self.output(ctx), deterministic=deterministic,
                              rngs=rngs)
    return self.layer_norm(out + x)
