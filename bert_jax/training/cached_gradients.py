"""The cached-gradient step: a large batch through an encoder a chunk at a
time (GradCache, Gao et al. 2021, "Scaling Deep Contrastive Learning Batch
Size under Memory Limited Setup").

For an objective whose loss is a function of per-example vectors
(``objectives.SplitLoss``: a bi-encoder's, every vector from its own
example), with ``train.cache_chunk_size`` = C:

  1. embed the batch C examples at a time, keeping no activations (a
     ``lax.map`` over chunks, outside any gradient);
  2. the loss over the whole batch's vectors, and its gradient with
     respect to the vectors (one small matrix, [B, K, d]);
  3. per chunk again, the encoder's vector-Jacobian product with that
     gradient, summed over chunks (a ``lax.scan``: one chunk's
     activations live at a time).

The result is the plain step's loss and gradient (up to float rounding)
at a peak memory of one chunk's activations plus the batch's vectors.
Chunks take every (B / C)-th row, so each spreads over every data-parallel
device like the batch. Dropout draws per chunk (the same draw in steps 1
and 3): with dropout on, the update is an equally valid one, not the plain
step's bit for bit.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def chunk(tree, k: int):
  """[B, ...] -> [k, B/k, ...]: chunk c is rows c, c + k, c + 2k, ..."""
  def split(x):
    x = x.reshape((x.shape[0] // k, k) + x.shape[1:])
    return jnp.swapaxes(x, 0, 1)
  return jax.tree.map(split, tree)


def unchunk(tree):
  """The inverse of :func:`chunk`: [k, B/k, ...] -> [B, ...]."""
  def merge(x):
    x = jnp.swapaxes(x, 0, 1)
    return x.reshape((x.shape[0] * x.shape[1],) + x.shape[2:])
  return jax.tree.map(merge, tree)


def gradients(params, batch, key, counts, *, graphdef, objective, config):
  """(gradient of the objective's loss over the global `batch` with
  respect to `params`, the loss sums), embedding
  ``train.cache_chunk_size`` examples at a time."""
  split = objective.split
  rows = batch["input_ids"].shape[0]
  k = rows // int(config.train.cache_chunk_size)
  chunks = chunk(batch, k)
  index = jnp.arange(k)

  def embed(p, micro, i):
    model = nnx.merge(graphdef, p)
    return split.embed(model, micro, jax.random.fold_in(key, i), False,
                       config)

  vectors = jax.lax.map(lambda xs: embed(params, *xs), (chunks, index))
  vectors = unchunk(jax.lax.stop_gradient(vectors))

  def loss_of(v):
    sums = split.sums(v, batch, config)
    return objective.loss(sums, counts, config), sums

  (_, sums), grad_vectors = jax.value_and_grad(loss_of, has_aux=True)(
      vectors)

  def body(acc, xs):
    micro, g, i = xs
    _, vjp = jax.vjp(lambda p: embed(p, micro, i), params)
    return jax.tree.map(jnp.add, acc, vjp(g)[0]), None

  grads, _ = jax.lax.scan(
      body, jax.tree.map(jnp.zeros_like, params),
      (chunks, chunk(grad_vectors, k), index))
  return grads, sums


def check(config, objective, data_parallel: int) -> None:
  """train.cache_chunk_size: 0, or a chunk of the batch (dividing it into
  whole chunks, each a multiple of the data-parallel size) for an objective
  with a split loss and no gradient accumulation."""
  t = config.train
  c = int(t.get("cache_chunk_size", 0))
  if not c:
    return
  if objective.split is None:
    raise ValueError(
        f"train.cache_chunk_size={c}: objective.name="
        f"{config.objective.name!r} is no loss over per-example vectors "
        "(a bi-encoder's, e.g. 'embed'), which the cached-gradient step "
        "needs; set it to 0.")
  if c < 0 or t.batch_size % c or c % data_parallel:
    raise ValueError(
        f"train.cache_chunk_size={c} must divide train.batch_size="
        f"{t.batch_size} and be a multiple of the data-parallel size "
        f"{data_parallel} (mesh.data*mesh.fsdp).")
  if int(t.grad_accum_steps) != 1:
    raise ValueError(f"train.cache_chunk_size={c} with "
                     f"train.grad_accum_steps={t.grad_accum_steps}: chunks "
                     "already bound the memory of a step; set "
                     "grad_accum_steps=1.")
