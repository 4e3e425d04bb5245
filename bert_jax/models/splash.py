"""Splash attention (TPU Pallas flash kernel) under BERT's padding mask,
packed rows, and ModernBERT's segments and sliding window.

`model.attention_impl="splash"` routes SelfAttention here. The kernel
(`jax.experimental.pallas.ops.tpu.splash_attention`) takes one example's
[heads, T, head_dim] and a static mask (full, or a `LocalMask` for a
window); the dynamic masks are expressed with its segment ids (a query
attends a key iff their ids match).

Packed rows (`sequence_ids`): the query and key ids are the sequence ids
themselves (0 = padding attends padding), so no query is ever without a key
and nothing else is needed. Padded rows:

* every query gets id 1; a key gets id 1 if it is a real token, 0 if padding.
  So every query, real or padded, attends exactly the real keys: the same
  as our XLA attention's additive -1e9 bias, position for position.
* a fully padded example would leave every query with no key (the kernel's
  softmax then divides by zero), so its keys all get id 1 and its output is
  replaced by the mean of `v` over the sequence, which is what the XLA path
  computes there (all scores shifted by the same -1e9 -> uniform weights).

Padded positions never reach a loss (MLM weights and example weights are 0
there), but matching XLA everywhere makes the two paths interchangeable and
lets the test compare every position. No attention dropout (the kernel has
none). Sequence length must be a multiple of 128 (the kernel's lane width).

A window (ModernBERT's sliding-window layers, ``attention.attend(...,
window=(left, right))``) is the kernel's static LocalMask band; with a window
a padded row's padding attends padding (its ids are the key ids), so that no
query's window is empty.

Under a mesh (`sharding.logical_context`) the kernel runs inside
`jax.shard_map`: batch split as "activation_batch", heads as
"activation_heads" (the sequence is gathered), since a Pallas call cannot be
partitioned by GSPMD.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax.core import spmd as flax_spmd
from jax.experimental.pallas.ops.tpu import splash_attention as sa

from bert_jax.models import logical

LANES = 128  # Block sizes (and so the sequence) must be multiples of this.


def check_seq_length(seq_length: int) -> None:
  """The kernel tiles the sequence in blocks of 128 tokens."""
  if seq_length % LANES:
    raise ValueError(
        f"model.attention_impl='splash' needs a sequence length that is a "
        f"multiple of {LANES}, got {seq_length}: set data.seq_length to one "
        "(e.g. 128 or 512) or use model.attention_impl='xla'.")


def _platform() -> str:
  """The mesh's platform (an ahead-of-time TPU compile runs on a CPU host)."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  return getattr(device, "platform", None) or jax.default_backend()


def _block(seq_length: int) -> int:
  """Largest of 512/256/128 dividing the sequence (fewer, larger tiles)."""
  return next(b for b in (512, 256, LANES) if seq_length % b == 0)


def _kernel(num_heads: int, seq_length: int, interpret: bool, window=None):
  """The kernel over full attention, or with `window` (left, right) a band:
  query i sees keys j with i - left <= j <= i + right."""
  b = _block(seq_length)
  blocks = sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b,
                         block_q_dkv=b, block_kv_dkv=b,
                         block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)
  shape = (seq_length, seq_length)
  head = (sa.FullMask(shape) if window is None else
          sa.LocalMask(shape, window_size=tuple(window), offset=0))
  mask = sa.MultiHeadMask([head] * num_heads)
  return sa.make_splash_mha_single_device(mask, block_sizes=blocks,
                                          interpret=interpret)


def _local_attention(q, k, v, q_ids, kv_ids, *, interpret, window):
  """q, k, v [B, T, H, D] (q scaled), q_ids / kv_ids [B, T] int32 ->
  [B, T, H, D]."""
  _, t, h, _ = q.shape
  kernel = _kernel(h, t, interpret, window)

  def one(q, k, v, q_ids, kv_ids):  # [H, T, D] each.
    return kernel(q, k, v, segment_ids=sa.SegmentIds(q=q_ids, kv=kv_ids))

  heads_major = lambda x: jnp.swapaxes(x, 1, 2)
  out = jax.vmap(one)(heads_major(q), heads_major(k), heads_major(v), q_ids,
                      kv_ids)
  return heads_major(out)


def _check_platform(interpret: bool) -> None:
  platform = _platform()
  if not interpret and platform != "tpu":
    raise ValueError(
        "model.attention_impl='splash' is a TPU kernel and this backend is "
        f"{platform!r}: use model.attention_impl='xla' (or "
        "'dot_product_attention') here.")


def _sharded(fn, num_id_args: int):
  """`fn(q, k, v, *ids)` inside jax.shard_map over the batch and heads
  under a mesh with rules (a Pallas call cannot be partitioned by GSPMD)."""
  rules = flax_spmd.get_logical_axis_rules()
  mesh = jax.sharding.get_abstract_mesh()
  if not rules or mesh.empty:
    return fn
  qkv_spec = logical.to_partition_spec(
      ("activation_batch", None, "activation_heads", None), rules)
  ids_spec = logical.to_partition_spec(("activation_batch", None), rules)
  return jax.shard_map(fn, mesh=mesh,
                       in_specs=(qkv_spec,) * 3 + (ids_spec,) * num_id_args,
                       out_specs=qkv_spec, check_vma=False)


def attention(q, k, v, input_mask, *, sequence_ids=None, window=None,
              interpret: bool = False) -> jax.Array:
  """Softmax attention of q, k, v [B, T, H, D] over the keys each query may
  attend.

  Args:
    q, k, v: projections in the compute dtype (q not yet scaled).
    input_mask: [B, T], nonzero at real tokens (read when `sequence_ids` is
      None: padded rows).
    sequence_ids: [B, T] packed sequence ids (0 = padding), or None.
    window: (left, right) local attention, or None.
    interpret: run the Pallas interpreter (tests on CPU; slow).

  Returns:
    [B, T, H, D] in q.dtype, equal to the XLA path at every position.
  """
  _check_platform(interpret)
  check_seq_length(q.shape[1])
  q = q * jnp.asarray(q.shape[-1] ** -0.5, q.dtype)
  if sequence_ids is not None:
    q_ids = kv_ids = jnp.asarray(sequence_ids).astype(jnp.int32)
    has_tokens = None
  else:
    real = input_mask > 0
    has_tokens = jnp.any(real, axis=-1)  # [B]
    kv_ids = jnp.where(has_tokens[:, None], real, True).astype(jnp.int32)
    q_ids = jnp.ones_like(kv_ids)

  fn = _sharded(lambda q, k, v, q_ids, kv_ids: _local_attention(
      q, k, v, q_ids, kv_ids, interpret=interpret, window=window), 2)
  out = fn(q, k, v, q_ids, kv_ids)
  if has_tokens is None:
    return out.astype(q.dtype)
  # A fully padded example: uniform weights over all keys, as in XLA.
  uniform = jnp.mean(v.astype(jnp.float32), axis=1, keepdims=True)
  return jnp.where(has_tokens[:, None, None, None], out,
                   uniform.astype(out.dtype)).astype(q.dtype)

