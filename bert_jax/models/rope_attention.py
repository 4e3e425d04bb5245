"""Self-attention with rotary positions over global or sliding-window
visibility: ModernBERT's attention (``models/modernbert.py``).

Who sees whom is decided from per-token positions and sequence ids, never
from array indices alone, so the same code serves padded and packed rows:

  query i sees key j  iff  seq[i] == seq[j]
                           (and, on a sliding-window layer,
                            |pos[i] - pos[j]| <= local_attention // 2)

A padded row has sequence ids 1 at real tokens and 0 at padding; a packed
row numbers its documents 1, 2, ... with 0 for padding, and restarts the
positions per document. Real tokens see only real tokens of their own
document (Hugging Face's ModernBERT mask at every real query: padding keys
masked, window ``abs(q - kv) <= sliding_window`` inclusive); padding sees
only padding, so no query ever has an empty row (the splash and cuDNN
kernels need that) and nothing ever flows from padding into real tokens.

Kinds (``model.attention_impl``):
  "xla"    explicit float32 softmax. A sliding-window layer over a long
           sequence runs blocked: queries in blocks of local_attention // 2
           against their block and its two neighbours (3 blocks of keys, the
           smallest span holding every window), exact and O(T) instead of
           O(T^2); :func:`keys_per_query` says what is computed, and the
           FLOP count (``models/flops.py``) reads it.
  "dot_product_attention" / "cudnn"  ``jax.nn.dot_product_attention``:
           cuDNN flash attention on GPU (bf16/fp16) with the padding as
           sequence lengths and the window as ``local_window_size``; XLA
           with the mask as a bias elsewhere.
  "splash" the TPU kernel with the sequence ids as segment ids and a
           LocalMask band on sliding-window layers (``models/splash.py``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.models import logical
from bert_jax.models import rotary
from bert_jax.models import splash
from bert_jax.models.attention import MASK_BIAS
from bert_jax.models.layers import Dense
from bert_jax.models.layers import compute_dtype
from bert_jax.models.layers import truncated_normal_init

# Sequence id of the block padding around a blocked sliding window: equal
# to no token's (real documents are >= 1, padding 0).
_OUTSIDE = -1


def half_window(config, is_global: bool) -> int | None:
  """Keys this far on each side are visible (None: all), as HF's
  ``sliding_window = local_attention // 2``."""
  return None if is_global else int(config.local_attention) // 2


def is_global_layer(config, index: int) -> bool:
  """Hugging Face ``layer_types``: full attention at layers 0, n, 2n, ...
  (n = model.global_attn_every_n_layers), a sliding window elsewhere."""
  return index % int(config.global_attn_every_n_layers) == 0


def blocked(seq_length: int, window: int | None) -> bool:
  """Whether a layer with `window` (half width) runs blocked: only when the
  three blocks of keys are fewer than the whole sequence."""
  return (window is not None and window > 0 and seq_length % window == 0
          and seq_length > 3 * window)


def keys_per_query(seq_length: int, window: int | None,
                   attention_impl: str = "xla") -> int:
  """Keys each query's scores are computed for: T, or 3 x window on a
  blocked sliding-window layer of the "xla" kind (the splash and cuDNN
  kernels skip masked tiles too, but at tile granularity)."""
  if attention_impl == "xla" and blocked(seq_length, window):
    return 3 * window
  return seq_length


def visible(q_pos, k_pos, q_seq, k_seq, window: int | None) -> jax.Array:
  """[..., Tq] and [..., Tk] positions / sequence ids -> [..., Tq, Tk]
  bool: which keys each query sees (the module docstring's rule)."""
  same = q_seq[..., :, None] == k_seq[..., None, :]
  if window is None:
    return same
  distance = jnp.abs(q_pos[..., :, None] - k_pos[..., None, :])
  return same & (distance <= window)


def _bias(mask):
  return jnp.where(mask, 0.0, MASK_BIAS).astype(jnp.float32)


def _blocks(x, size: int, pad_value=0):
  """[B, T, ...] -> [B, T/size, 3*size, ...]: for block n, blocks n-1, n
  and n+1 (padded with `pad_value` beyond the ends)."""
  b, t = x.shape[:2]
  widths = [(0, 0), (size, size)] + [(0, 0)] * (x.ndim - 2)
  xp = jnp.pad(x, widths, constant_values=pad_value)
  xb = xp.reshape((b, t // size + 2, size) + x.shape[2:])
  return jnp.concatenate([xb[:, :-2], xb[:, 1:-1], xb[:, 2:]], axis=2)


class Attention(nnx.Module):
  """Fused query/key/value, rotary positions, attention, output projection
  (HF ``ModernBertAttention``; no biases; dropout on the probabilities and
  on the output, both model.attention_probs_dropout_prob as HF's
  ``attention_dropout``)."""

  def __init__(self, config, *, is_global: bool, rngs: nnx.Rngs):
    d, h = config.hidden_size, config.num_attention_heads
    self.num_heads, self.head_dim = h, d // h
    self.window = half_window(config, is_global)
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

  def __call__(self, x, positions, sequence_ids, *, deterministic, rngs):
    """x [B, T, d]; positions and sequence_ids [B, T] ints."""
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
    ctx = self._attend(q, k, v, positions, sequence_ids, deterministic, rngs)
    out = self.wo(ctx.reshape(b, t, d))
    return self.dropout(out, deterministic=deterministic, rngs=rngs)

  def _attend(self, q, k, v, positions, seq, deterministic, rngs):
    impl = self.attention_impl
    if impl != "xla" and not deterministic and self.dropout.rate > 0:
      raise ValueError(
          f"model.attention_impl={impl!r} has no attention dropout: set "
          "model.attention_probs_dropout_prob=0 to train with it or use "
          "model.attention_impl='xla'.")
    if impl == "splash":
      return splash.segment_attention(q, k, v, seq, half_window=self.window,
                                      interpret=self.splash_interpret)
    if impl == "dot_product_attention":
      impl = ("cudnn" if jax.default_backend() == "gpu"
              and self.dtype in (jnp.bfloat16, jnp.float16) else "xla-fused")
    if impl == "cudnn":
      # Padding at the end of each row (as the pipeline pads) as lengths.
      lengths = jnp.sum(seq > 0, axis=-1).astype(jnp.int32)
      window = None if self.window is None else (self.window, self.window)
      return jax.nn.dot_product_attention(
          q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
          local_window_size=window, implementation="cudnn")
    if impl == "xla-fused":
      mask = visible(positions, positions, seq, seq, self.window)[:, None]
      return jax.nn.dot_product_attention(q, k, v, mask=mask,
                                          implementation="xla")
    if blocked(q.shape[1], self.window):
      return self._blocked(q, k, v, positions, seq, deterministic, rngs)
    return self._dense(q, k, v, positions, seq, deterministic, rngs)

  def _dense(self, q, k, v, positions, seq, deterministic, rngs):
    """Every query against every key, the mask as an additive bias."""
    mask = visible(positions, positions, seq, seq, self.window)
    q = q * jnp.asarray(self.head_dim ** -0.5, q.dtype)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                        preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores + _bias(mask)[:, None], axis=-1)
    probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
    return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(self.dtype), v,
                      preferred_element_type=jnp.float32).astype(self.dtype)

  def _blocked(self, q, k, v, positions, seq, deterministic, rngs):
    """The sliding window in blocks of `window` queries: block n against
    blocks n-1..n+1, which hold every key any of its queries may see."""
    b, t, h, dh = q.shape
    w = self.window
    n = t // w
    q = (q * jnp.asarray(dh ** -0.5, q.dtype)).reshape(b, n, w, h, dh)
    kb, vb = _blocks(k, w), _blocks(v, w)  # [B, N, 3w, H, D]
    mask = visible(positions.reshape(b, n, w), _blocks(positions, w),
                   seq.reshape(b, n, w), _blocks(seq, w, _OUTSIDE), w)
    scores = jnp.einsum("bnqhd,bnkhd->bnhqk", q, kb,
                        preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(scores + _bias(mask)[:, :, None], axis=-1)
    probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
    ctx = jnp.einsum("bnhqk,bnkhd->bnqhd", probs.astype(self.dtype), vb,
                     preferred_element_type=jnp.float32)
    return ctx.reshape(b, t, h, dh).astype(self.dtype)
