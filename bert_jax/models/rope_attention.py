"""Self-attention with rotary positions over global or sliding-window
visibility: ModernBERT's attention (``models/modernbert.py``).

Who sees whom is packing's mask API (``models/attention.py``), the one every
encoder family calls: the model builds ``attention.make_mask(input_mask,
sequence_ids)`` once and each layer passes it to ``attention.attend`` with
its window, so padded and packed rows run the same code:

  query i sees key j  iff  it may under the mask (packed rows: the same
                           document; padded rows: a real key)
                           and, on a sliding-window layer,
                           |i - j| <= local_attention // 2

Inside one packed document the token index and the position id differ by a
constant, so the window is the one in positions too; RoPE reads the
positions (``position_ids``, restarting per document; 0..T-1 on padded
rows). Real tokens see exactly Hugging Face's ModernBERT mask (padding keys
masked, window ``abs(q - kv) <= sliding_window`` inclusive) and never a key
of another document. On a sliding-window layer a padded query sees padding
(so no window is empty); on a global one the real keys, as Hugging Face's.

Kinds (``model.attention_impl``), all in ``attention.attend``: "xla"
(explicit float32 softmax; a sliding window over a long sequence runs
blocked, O(T) instead of O(T^2): ``attention.keys_per_query``, which the
FLOP count reads), "dot_product_attention" / "cudnn"
(``jax.nn.dot_product_attention``; cuDNN with padded rows as lengths and the
window as ``local_window_size``), "splash" (the TPU kernel, sequence ids as
segment ids and a LocalMask band).
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from bert_jax.models import attention as attention_lib
from bert_jax.models import logical
from bert_jax.models import rotary
from bert_jax.models.layers import Dense
from bert_jax.models.layers import compute_dtype
from bert_jax.models.layers import truncated_normal_init


def half_window(config, is_global: bool) -> int | None:
  """Keys this far on each side are visible (None: all), as HF's
  ``sliding_window = local_attention // 2``."""
  return None if is_global else int(config.local_attention) // 2


def window(config, is_global: bool) -> tuple[int, int] | None:
  """The layer's window as ``attention.attend`` takes it."""
  w = half_window(config, is_global)
  return None if w is None else (w, w)


def is_global_layer(config, index: int) -> bool:
  """Hugging Face ``layer_types``: full attention at layers 0, n, 2n, ...
  (n = model.global_attn_every_n_layers), a sliding window elsewhere."""
  return index % int(config.global_attn_every_n_layers) == 0


class Attention(nnx.Module):
  """Fused query/key/value, rotary positions, attention, output projection
  (HF ``ModernBertAttention``; no biases; dropout on the probabilities and
  on the output, both model.attention_probs_dropout_prob as HF's
  ``attention_dropout``)."""

  def __init__(self, config, *, is_global: bool, rngs: nnx.Rngs):
    d, h = config.hidden_size, config.num_attention_heads
    self.num_heads, self.head_dim = h, d // h
    self.window = window(config, is_global)
    self.rope_theta = float(config.global_rope_theta if is_global
                            else config.local_rope_theta)
    std, cut = config.initializer_range, 2.0
    out_std = std / (2.0 * config.num_hidden_layers) ** 0.5
    # [d, 3, d]: (query, key, value) on their own axis so that a
    # "heads"-split output dim splits each of them, not across them.
    self.wqkv = nnx.Param(truncated_normal_init(
        std, cut, ("embed", None, "heads"))(rngs.params(), (d, 3, d)))
    self.wo = Dense(config, d, d, ("heads", "embed"), rngs=rngs,
                    use_bias=False,
                    init=truncated_normal_init(out_std, cut,
                                               ("heads", "embed")))
    self.dropout = nnx.Dropout(config.attention_probs_dropout_prob)
    self.dtype = compute_dtype(config)
    self.attention_impl = config.attention_impl
    self.splash_interpret = bool(config.splash_interpret)

  def __call__(self, x, positions, mask: attention_lib.AttentionMask, *,
               deterministic, rngs):
    """x [B, T, d]; positions [B, T] ints; `mask` from attention.make_mask."""
    b, t, d = x.shape
    qkv = jnp.einsum("bti,ijo->btjo", x.astype(self.dtype),
                     self.wqkv[...].astype(self.dtype),
                     preferred_element_type=jnp.float32).astype(self.dtype)
    heads = lambda y: logical.constrain(
        y.reshape(b, t, self.num_heads, self.head_dim),
        ("activation_batch", "activation_length", "activation_heads", None))
    q, k, v = (heads(qkv[:, :, i]) for i in range(3))
    cos, sin = rotary.tables(positions, self.head_dim, self.rope_theta)
    q, k = rotary.apply(q, cos, sin), rotary.apply(k, cos, sin)
    ctx = attention_lib.attend(
        q, k, v, mask, impl=self.attention_impl, window=self.window,
        dropout=self.dropout, deterministic=deterministic, rngs=rngs,
        splash_interpret=self.splash_interpret)
    out = self.wo(ctx.reshape(b, t, d))
    return self.dropout(out, deterministic=deterministic, rngs=rngs)
