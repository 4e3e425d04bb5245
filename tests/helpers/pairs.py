"""Sentence-pair fixtures: a tiny embedding config and synthetic batches of
the pairs kind (``features.pair_spec``), for the step and mesh tests."""

from __future__ import annotations

TEXTS = 3  # Anchor, positive, one hard negative.
# Packed rows: at most this many texts a row, of one of these lengths.
MAX_SEQUENCES, ROW_LENGTHS = 8, (32, 48, 64)


def pairs_config(loss: str, data=1, fsdp=1, tensor=1, chunk=0,
                 packing=False):
  """tests.helpers' sharded config with the "embed" objective (`loss`:
  "infonce" or "cosent"; `chunk`: train.cache_chunk_size; `packing`:
  data.packing, at most MAX_SEQUENCES texts a row)."""
  from tests import helpers
  c = helpers.sharded_config(data, fsdp, tensor,
                             train=dict(cache_chunk_size=chunk))
  c.objective.update(name="embed", encoder="bert", pair_loss=loss)
  c.data.update(packing=packing, packing_max_sequences=MAX_SEQUENCES)
  return c


def packed(batch: dict, chunks: int = 1) -> dict:
  """`batch`'s texts packed into as many rows as it has examples (each of
  `chunks` chunks into its own rows, as the cached step embeds them)."""
  from bert_jax.data import pair_batches
  return pair_batches.pack(batch, pair_batches.Packing(
      pair_batches.row_lengths_for(ROW_LENGTHS, TEXTS), MAX_SEQUENCES,
      chunks))


def pairs_batch(step: int):
  """16 examples of 3 random texts of random lengths, all distinct."""
  import numpy as np

  from tests import helpers
  r = np.random.RandomState(100 + step)
  b, t = helpers.BATCH, helpers.SEQ
  lengths = r.randint(4, t + 1, (b, TEXTS))
  mask = (np.arange(t) < lengths[..., None]).astype(np.int32)
  ids = r.randint(5, helpers.VOCAB, (b, TEXTS, t)).astype(np.int32) * mask
  return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids),
              text_ids=np.arange(b * TEXTS, dtype=np.int32).reshape(b, TEXTS),
              scores=r.uniform(0, 5, b).astype(np.float32),
              example_weights=np.ones(b, np.float32))


def assert_same_gradients(actual, expected) -> None:
  """Every leaf of `actual` equals `expected`'s within 1e-5, relative to
  the leaf, or absolute against the largest gradient of all (a leaf near
  0 carries float rounding of the sums it is made of)."""
  import jax
  import numpy as np
  flat = jax.tree.leaves_with_path(expected)
  scale = max(float(np.abs(g).max()) for _, g in flat)
  for (path, g), a in zip(flat, jax.tree.leaves(actual)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(g),
                               atol=1e-5 * scale, rtol=1e-5, err_msg=str(path))
