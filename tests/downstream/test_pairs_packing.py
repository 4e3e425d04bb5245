"""Packed pairs batches (data.packing with task kind "pairs").

A batch's B x K texts packed into B rows hold every text once, whole,
with its own positions, in the shortest row length that holds them; the
train step on the packed rows has the padded step's loss and gradients
(InfoNCE with a hard negative, CoSENT; BERT, and ModernBERT with a sliding
window shorter than a row), and so does the cached-gradient step on rows
packed chunk by chunk; packing is refused where an example's texts cannot
share a row. (8 devices: tests/training/test_pairs_mesh.py; a whole run and
its resume: tests/downstream/test_pairs_finetune.py.)
"""

import jax
import numpy as np
import pytest

from bert_jax.data import pair_batches
from bert_jax.tasks import pairs
from bert_jax.training import cached_gradients
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests.helpers import pairs as pair_fixtures

CHUNK = 4


def _with_empty_slots(batch: dict) -> dict:
  """Two examples without their hard negative (an empty slot, id -1)."""
  batch = {k: v.copy() for k, v in batch.items()}
  for row in (3, 10):
    batch["input_ids"][row, 2] = 0
    batch["input_mask"][row, 2] = 0
    batch["text_ids"][row, 2] = -1
  return batch


def test_each_text_sits_once_whole_in_one_of_b_rows():
  batch = _with_empty_slots(pair_fixtures.pairs_batch(0))
  out = pair_fixtures.packed(batch)
  b, k, _ = batch["input_ids"].shape
  s = pair_fixtures.MAX_SEQUENCES
  t = out["input_ids"].shape[1]
  assert out["input_ids"].shape[0] == b and out["slots"].shape == (b, k)
  assert t in pair_batches.row_lengths_for(pair_fixtures.ROW_LENGTHS, k)
  real = out["slots"][batch["text_ids"] >= 0]
  assert len(set(real.tolist())) == len(real)  # One place a text.
  assert (out["slots"][batch["text_ids"] < 0] == -1).all()
  for (e, j), slot in np.ndenumerate(out["slots"]):
    n = int(batch["input_mask"][e, j].sum())
    if slot < 0:
      continue
    row, place = divmod(int(slot), s)
    at = np.flatnonzero(out["sequence_ids"][row] == place + 1)
    assert at[0] == out["cls_positions"][row, place] and len(at) == n
    np.testing.assert_array_equal(out["input_ids"][row, at],
                                  batch["input_ids"][e, j, :n])
    np.testing.assert_array_equal(out["position_ids"][row, at], np.arange(n))
  assert out["input_mask"].sum() == batch["input_mask"].sum()
  # The shortest length that holds them: one length shorter does not.
  shorter = [x for x in pair_batches.row_lengths_for(
      pair_fixtures.ROW_LENGTHS, k) if x < t]
  if shorter:
    with pytest.raises(ValueError, match="do not fit"):
      pair_batches.pack(batch, pair_batches.Packing(tuple(shorter), s))
  for name in ("text_ids", "scores", "example_weights"):
    np.testing.assert_array_equal(out[name], batch[name])


def test_b_rows_always_hold_a_batch_of_the_longest_texts():
  batch = pair_fixtures.pairs_batch(1)
  batch["input_mask"][:] = 1  # Every text as long as a bucket.
  out = pair_fixtures.packed(batch)
  k = batch["input_ids"].shape[1]
  assert out["input_ids"].shape[1] == k * max(pair_fixtures.ROW_LENGTHS)
  assert out["input_mask"].sum() == batch["input_mask"].sum()


def _short(batch: dict, longest: int) -> dict:
  """The batch's texts cut to `longest` tokens."""
  batch = dict(batch)
  keep = np.arange(batch["input_ids"].shape[-1]) < longest
  batch["input_mask"] = batch["input_mask"] * keep
  batch["input_ids"] = batch["input_ids"] * batch["input_mask"]
  return batch


# ModernBERT: no token types, a sliding window shorter than a packed row.
MODERNBERT = dict(type_vocab_size=0, local_attention=8,
                  global_attn_every_n_layers=2, layer_norm_eps=1e-5)


def _config(loss: str, family: str, normalize: bool, packing=False):
  config = pair_fixtures.pairs_config(loss, packing=packing)
  config.objective.encoder = family
  config.model.embedding_normalize = normalize
  if family == "modernbert":
    config.model.update(MODERNBERT)
  return config


@pytest.mark.parametrize("loss,normalize,longest,family", [
    ("infonce", False, 32, "bert"), ("cosent", False, 32, "bert"),
    # Short texts leave empty rows and slots: zero vectors, whose L2
    # normalisation must pass no NaN back.
    ("infonce", True, 8, "bert"), ("cosent", True, 8, "bert"),
    ("infonce", True, 32, "modernbert")])
def test_packed_loss_and_gradients_equal_the_padded_steps(loss, normalize,
                                                          longest, family):
  config = _config(loss, family, normalize)
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  batch = _short(pair_fixtures.pairs_batch(0), longest)
  if loss == "cosent":  # Pairs: CoSENT scores two texts.
    batch = {k: (v[:, :2] if v.ndim > 1 else v) for k, v in batch.items()}
  with programs.context():
    params = programs.init()["params"]
  grad = lambda c, b: jax.value_and_grad(steps_lib.batch_loss)(
      params, b, graphdef=programs.graphdef, config=c,
      objective=programs.objective)
  padded_loss, padded = grad(config, batch)
  packed_config = _config(loss, family, normalize, packing=True)
  packed_batch = pair_fixtures.packed(batch)
  assert packed_batch["input_mask"].size < batch["input_mask"].size
  if longest < 32:
    assert not packed_batch["input_mask"].any(1).all()  # An empty row.
  packed_loss, packed = grad(packed_config, packed_batch)
  np.testing.assert_allclose(float(packed_loss), float(padded_loss),
                             rtol=1e-5)
  pair_fixtures.assert_same_gradients(packed, padded)


def test_the_cached_step_on_packed_chunks_is_the_padded_plain_step():
  config = pair_fixtures.pairs_config("infonce")
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  batch = pair_fixtures.pairs_batch(2)
  with programs.context():
    params = programs.init()["params"]
  plain_loss, plain = jax.value_and_grad(steps_lib.batch_loss)(
      params, batch, graphdef=programs.graphdef, config=config,
      objective=programs.objective)
  cached = pair_fixtures.pairs_config("infonce", chunk=CHUNK, packing=True)
  chunks = len(batch["input_ids"]) // CHUNK
  packed_batch = pair_fixtures.packed(batch, chunks)
  # Each chunk's slots point into the chunk's own rows.
  assert packed_batch["slots"].max() < CHUNK * pair_fixtures.MAX_SEQUENCES
  objective = programs.objective
  grads, sums = jax.jit(lambda p, b: cached_gradients.gradients(
      p, b, jax.random.key(0), objective.counts(b, cached),
      graphdef=programs.graphdef, objective=objective, config=cached))(
          params, packed_batch)
  counts = objective.counts(packed_batch, cached)
  np.testing.assert_allclose(float(objective.loss(sums, counts, cached)),
                             float(plain_loss), rtol=1e-5)
  pair_fixtures.assert_same_gradients(grads, plain)


def test_fewer_slots_a_row_than_texts_an_example_is_refused():
  config = pair_fixtures.pairs_config("infonce", packing=True)
  config.data.packing_max_sequences = 1  # An anchor and its positive: 2.
  with pytest.raises(ValueError) as e:
    pairs.validate(config)
  assert str(e.value).startswith(
      "data.packing_max_sequences=1 must be >= the 2 texts of a training "
      "example"), e.value
