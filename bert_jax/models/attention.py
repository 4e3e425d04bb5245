"""Multi-head self-attention over padded or packed rows, in every kind
``model.attention_impl`` names.

Kinds: "xla" (explicit softmax; the only one with attention dropout),
"dot_product_attention" (``jax.nn.dot_product_attention``: cuDNN flash
attention on GPU in bf16/fp16, XLA elsewhere; "cudnn" forces it), "splash"
(the TPU Pallas kernel, ``models/splash.py``).

Which keys a query may attend: the API every encoder family calls
-----------------------------------------------------------------
A row of a batch holds one sequence padded at the end, or several sequences
packed one after another. A packed batch carries ``sequence_ids`` ([B, T]
int32: 1, 2, ... for the row's first, second, ... sequence, 0 at padding)
and ``position_ids`` ([B, T] int32, restarting at 0 in each sequence), see
``data/features.py``. An encoder builds one mask per forward pass and hands
it to every layer::

  mask = attention.make_mask(input_mask, sequence_ids)  # ids None: padded
  ctx = attention.attend(q, k, v, mask, impl=config.attention_impl,
                         window=None, ...)              # [B, T, H, D]

* :class:`AttentionMask` ``(kv_ids, q_ids)``, a NamedTuple (so a pytree: it
  passes through jit, remat and scan). ``kv_ids`` [B, T]: the sequence id of
  each key, 0 = padding. ``q_ids`` [B, T]: that of each query, or None for
  padded rows, where every query, padded ones too, attends every real key
  (BERT's key-padding mask, as Hugging Face computes it: exported models and
  unpacked training compute Hugging Face's numbers at every position).
* :func:`allowed` ``(mask, window=None)`` -> bool [B, 1, Tq or 1, Tk]:
  query i may attend key j iff ``q_ids[i] == kv_ids[j]`` (packed rows:
  padding attends padding, so no query is ever left without a key) or
  ``kv_ids[j] != 0`` (padded rows); with ``window=(left, right)`` also
  ``i - left <= j <= i + right`` (and a padded row's padding then attends
  padding, as in a packed row, so that no window is empty). Inside one
  packed sequence the token index and the position id differ by a
  constant, so this is the window in positions too (ModernBERT's local
  layers: ``(64, 64)``).
* :func:`bias` ``(mask, window=None)``: the same as an additive float32 bias
  (0 or :data:`MASK_BIAS`, finite in every dtype).
* :func:`attend`: softmax(q k^T / sqrt(D) + mask) v by kind. "xla" adds the
  bias (and applies attention dropout); "dot_product_attention" on XLA gets
  the bias (padded rows) or the boolean mask (packed rows, windows); "cudnn"
  gets padded rows as lengths (a window as its ``local_window_size``) and
  packed rows as the boolean mask; "splash" gets the ids as its ``SegmentIds`` and the window as a
  static ``LocalMask``. q is scaled inside; no projection, no output layer.
* "xla" runs a symmetric window ``(w, w)`` blocked when that is cheaper
  (:func:`blocked`): queries in blocks of w against their block and its two
  neighbours, exact and O(T w); :func:`keys_per_query` says how many keys
  a query's scores are computed for (the FLOP count reads it).
* :func:`segment_positions` ``(sequence_ids)`` -> position ids restarting at
  0 in each sequence (the pipeline emits them; this is for a caller that has
  sequence ids alone).

:class:`SelfAttention` is BERT's block (projections with biases, post-LN
residual) on top of :func:`attend`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from bert_jax.models import logical
from bert_jax.models import splash
from bert_jax.models.layers import Dense
from bert_jax.models.layers import LayerNorm
from bert_jax.models.layers import compute_dtype

# Added to attention scores at keys a query may not attend. Scores are
# float32, so this is finite and far below any real score; a fully padded
# row stays finite.
MASK_BIAS = -1e9


ATTENTION_IMPLS = ("xla", "dot_product_attention", "cudnn", "splash")


class AttentionMask(NamedTuple):
  """Which keys each query may attend (see the module docstring)."""
  kv_ids: jax.Array  # [B, T] int32: the key's sequence id, 0 = padding.
  q_ids: jax.Array | None = None  # [B, T] int32, or None: padded rows.

  @property
  def packed(self) -> bool:
    return self.q_ids is not None


def padding_mask(input_mask) -> AttentionMask:
  """Padded rows: [B, T] 1/0 (real/padding) -> every query sees real keys."""
  return AttentionMask(kv_ids=(jnp.asarray(input_mask) > 0).astype(jnp.int32))


def packed_mask(sequence_ids) -> AttentionMask:
  """Packed rows: [B, T] sequence ids (0 = padding) -> a query sees the keys
  of its own sequence only."""
  ids = jnp.asarray(sequence_ids).astype(jnp.int32)
  return AttentionMask(kv_ids=ids, q_ids=ids)


def make_mask(input_mask, sequence_ids=None) -> AttentionMask:
  """The mask of a batch: packed when it carries sequence ids, else padded."""
  if sequence_ids is None:
    return padding_mask(input_mask)
  return packed_mask(sequence_ids)


def at_queries(mask: AttentionMask, positions) -> AttentionMask:
  """The mask of the queries at `positions` [B, S] alone (every key kept):
  a layer whose output is read at a few positions computes only those
  queries."""
  if not mask.packed:
    return mask  # Padded rows: every query attends the same real keys.
  return AttentionMask(kv_ids=mask.kv_ids, q_ids=jnp.take_along_axis(
      mask.q_ids, positions, axis=1))


def query_ids(mask: AttentionMask, window):
  """The queries' ids, or None (padded rows: every query sees real keys).
  With a window a padded row's padding attends padding (as in a packed
  row), so that no padded query is left without a key in its window."""
  if mask.packed:
    return mask.q_ids
  return None if window is None else mask.kv_ids


def allowed(mask: AttentionMask, window: tuple[int, int] | None = None):
  """bool [B, 1, Tq or 1, Tk]: True where query i may attend key j."""
  q_ids = query_ids(mask, window)
  if q_ids is not None:
    ok = q_ids[:, None, :, None] == mask.kv_ids[:, None, None, :]
  else:
    ok = (mask.kv_ids > 0)[:, None, None, :]
  if window is not None:
    left, right = window
    t = mask.kv_ids.shape[-1]
    i = jnp.arange(t)[:, None]
    j = jnp.arange(t)[None, :]
    ok = ok & ((j >= i - left) & (j <= i + right))[None, None]
  return ok


def bias(mask: AttentionMask, window: tuple[int, int] | None = None):
  """float32 [B, 1, Tq or 1, Tk]: 0 where allowed, MASK_BIAS elsewhere."""
  return jnp.where(allowed(mask, window), 0.0, MASK_BIAS).astype(jnp.float32)


# Sequence id of the block padding around a blocked window: equal to no
# token's (sequences are >= 1, padding 0).
_OUTSIDE = -1


def blocked(seq_length: int, window: tuple[int, int] | None) -> bool:
  """Whether the "xla" kind runs a window blocked: a symmetric window of
  half width w > 0 with w dividing the sequence, and three blocks of keys
  fewer than the whole sequence."""
  if window is None:
    return False
  left, right = window
  return (left == right and left > 0 and seq_length % left == 0
          and seq_length > 3 * left)


def keys_per_query(seq_length: int, window: tuple[int, int] | None,
                   impl: str = "xla") -> int:
  """Keys each query's scores are computed for: T, or 3 x w on a blocked
  window of the "xla" kind (the splash and cuDNN kernels skip masked tiles
  too, but at tile granularity). ``models/flops.py`` reads it."""
  if impl == "xla" and blocked(seq_length, window):
    return 3 * window[0]
  return seq_length


def _blocks(x, size: int, pad_value=0):
  """[B, T, ...] -> [B, T/size, 3*size, ...]: for block n, blocks n-1, n
  and n+1 (padded with `pad_value` beyond the ends)."""
  b, t = x.shape[:2]
  widths = [(0, 0), (size, size)] + [(0, 0)] * (x.ndim - 2)
  xp = jnp.pad(x, widths, constant_values=pad_value)
  xb = xp.reshape((b, t // size + 2, size) + x.shape[2:])
  return jnp.concatenate([xb[:, :-2], xb[:, 1:-1], xb[:, 2:]], axis=2)


def _blocked_attend(q, k, v, mask: AttentionMask, w: int, dropout,
                    deterministic, rngs):
  """A symmetric window of half width w in blocks of w queries: block n
  against blocks n-1..n+1, which hold every key any of its queries may
  see; exact, and O(T w) instead of O(T^2). q already scaled."""
  b, t, h, dh = q.shape
  n = t // w
  ids = query_ids(mask, (w, w))  # Padded rows: padding attends padding.
  index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  q_ids, q_pos = ids.reshape(b, n, w), index.reshape(b, n, w)
  k_ids, k_pos = _blocks(mask.kv_ids, w, _OUTSIDE), _blocks(index, w)
  ok = ((q_ids[..., :, None] == k_ids[..., None, :])
        & (jnp.abs(q_pos[..., :, None] - k_pos[..., None, :]) <= w))
  scores = jnp.einsum("bnqhd,bnkhd->bnhqk", q.reshape(b, n, w, h, dh),
                      _blocks(k, w), preferred_element_type=jnp.float32)
  bias_ = jnp.where(ok, 0.0, MASK_BIAS).astype(jnp.float32)[:, :, None]
  probs = jax.nn.softmax(scores + bias_, axis=-1)
  if dropout is not None:
    probs = dropout(probs, deterministic=deterministic, rngs=rngs)
  ctx = jnp.einsum("bnhqk,bnkhd->bnqhd", probs.astype(q.dtype), _blocks(v, w),
                   preferred_element_type=jnp.float32)
  return ctx.reshape(b, t, h, dh).astype(q.dtype)


def segment_positions(sequence_ids) -> jax.Array:
  """[B, T] sequence ids -> position ids restarting at 0 in each sequence
  (and in each run of padding)."""
  ids = jnp.asarray(sequence_ids)
  t = ids.shape[-1]
  index = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), ids.shape)
  starts = jnp.concatenate(
      [jnp.ones_like(ids[..., :1], bool), ids[..., 1:] != ids[..., :-1]],
      axis=-1)
  first = jax.lax.cummax(jnp.where(starts, index, 0), axis=ids.ndim - 1)
  return index - first


def _dropout_refused(impl: str) -> ValueError:
  return ValueError(
      f"model.attention_impl={impl!r} has no attention dropout: set "
      "model.attention_probs_dropout_prob=0 to train with it or use "
      "model.attention_impl='xla'.")


def attend(q, k, v, mask: AttentionMask, *, impl: str = "xla",
           window: tuple[int, int] | None = None, dropout=None,
           deterministic: bool = True, rngs=None,
           splash_interpret: bool = False) -> jax.Array:
  """softmax(q k^T / sqrt(D) + mask) v for q, k, v [B, T, H, D].

  Args:
    q, k, v: projections in the compute dtype (q not yet scaled).
    mask: from :func:`make_mask` (padded or packed rows).
    impl: one of :data:`ATTENTION_IMPLS`.
    window: (left, right) local attention, or None (every allowed key).
    dropout: an ``nnx.Dropout`` on the probabilities ("xla" only; the fused
      kinds refuse a non-zero rate in training).
    deterministic, rngs: as for dropout.
    splash_interpret: run the splash kernel in the Pallas interpreter.

  Returns:
    The context [B, T, H, D] in q.dtype.
  """
  dtype = q.dtype
  if impl != "xla":
    if (not deterministic and dropout is not None and dropout.rate > 0):
      raise _dropout_refused(impl)
    if impl == "splash":
      return splash.attention(
          q, k, v, mask.kv_ids, sequence_ids=query_ids(mask, window),
          window=window, interpret=splash_interpret)
    if impl == "dot_product_attention":
      impl = ("cudnn" if jax.default_backend() == "gpu"
              and dtype in (jnp.bfloat16, jnp.float16) else "xla")
    if impl == "cudnn":
      if mask.packed:
        return jax.nn.dot_product_attention(
            q, k, v, mask=allowed(mask, window), implementation="cudnn")
      # cuDNN's flash kernel takes padding as lengths (the pipeline pads at
      # the end) and a window as its local_window_size.
      lengths = jnp.sum(mask.kv_ids, axis=-1).astype(jnp.int32)
      return jax.nn.dot_product_attention(
          q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths,
          local_window_size=None if window is None else tuple(window),
          implementation="cudnn")
    if mask.packed or window is not None:
      return jax.nn.dot_product_attention(q, k, v, mask=allowed(mask, window),
                                          implementation="xla")
    # -1e9 overflows to -inf in float16: clamp to a finite value of q.dtype.
    b = jnp.maximum(bias(mask), jnp.finfo(dtype).min / 2).astype(dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=b, implementation="xla")
  q = q * jnp.asarray(q.shape[-1] ** -0.5, dtype)
  if blocked(q.shape[1], window):
    return _blocked_attend(q, k, v, mask, window[0], dropout, deterministic,
                           rngs)
  scores = jnp.einsum("bqhd,bkhd->bhqk", q, k,
                      preferred_element_type=jnp.float32)
  probs = jax.nn.softmax(scores + bias(mask, window), axis=-1)
  if dropout is not None:
    probs = dropout(probs, deterministic=deterministic, rngs=rngs)
  return jnp.einsum("bhqk,bkhd->bqhd", probs.astype(dtype), v,
                    preferred_element_type=jnp.float32).astype(dtype)


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

  def _qkv(self, x, queries_at=None):
    """Heads of q, k, v [B, T, H, D]; with `queries_at` [B, S], q at those
    positions alone ([B, S, H, D])."""
    if not self.fused_qkv:
      xq = x if queries_at is None else _take(x, queries_at)
      return tuple(self._heads(f(y)) for f, y in (
          (self.query, xq), (self.key, x), (self.value, x)))
    # One [d, 3, d] matmul instead of three [d, d]; params stay separate (HF
    # names). Stacked on a new axis so a "heads"-sharded dim stays local.
    w = jnp.stack([f.kernel[...] for f in (self.query, self.key, self.value)],
                  axis=1)
    b = jnp.stack([f.bias[...] for f in (self.query, self.key, self.value)])
    y = jnp.einsum("...i,ito->...to", x.astype(self.dtype),
                   w.astype(self.dtype), preferred_element_type=jnp.float32)
    y = y.astype(self.dtype) + b.astype(self.dtype)
    q, k, v = (self._heads(y[..., i, :]) for i in range(3))
    return (q if queries_at is None else _take(q, queries_at)), k, v

  def __call__(self, x, mask: AttentionMask, *, deterministic, rngs,
               queries_at=None):
    """x [B, T, d] -> [B, T, d]; with `queries_at` [B, S] the output at
    those positions alone, [B, S, d]: their queries attend every key they
    may, and nothing past the keys and values is computed elsewhere. The
    few queries attend by the "xla" formula whatever ``attention_impl`` is
    (an S x T score matrix, free of the kernels' tiling constraints)."""
    q, k, v = self._qkv(x, queries_at)
    if queries_at is None:
      ctx = attend(q, k, v, mask, impl=self.attention_impl,
                   dropout=self.attention_dropout,
                   deterministic=deterministic, rngs=rngs,
                   splash_interpret=self.splash_interpret)
    else:
      x = _take(x, queries_at)
      ctx = attend(q, k, v, at_queries(mask, queries_at), impl="xla",
                   dropout=self.attention_dropout,
                   deterministic=deterministic, rngs=rngs)
    out = self.output_dropout(self.output(ctx.reshape(x.shape)),
                              deterministic=deterministic, rngs=rngs)
    return self.layer_norm(out + x)


def _take(x, positions):
  """[B, T, ...] at [B, S] positions -> [B, S, ...]."""
  index = positions.reshape(positions.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)
