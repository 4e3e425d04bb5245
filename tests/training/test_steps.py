"""training/steps.py on one device: gradient accumulation is one large
batch, and the work a batch counts (tokens, attended pairs, predictions)
is its real content. (The same on 8 simulated devices and every mesh is
test_sharding's, in the slow tier.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests import helpers


@pytest.fixture
def few_optimizations():
  """Two tiny steps: compile fast rather than run fast."""
  disabled = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield
  jax.config.update("jax_disable_most_optimizations", disabled)


def _two_steps(accum: int):
  config = helpers.sharded_config(
      accum=accum, num_steps=2, model=dict(num_hidden_layers=1, hidden_size=32,
                                           num_attention_heads=2,
                                           intermediate_size=64))
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  with programs.context():
    state = programs.init()
    losses = []
    for step in range(2):
      batch = sharding.global_batch(helpers.synthetic_batch(100 + step),
                                    programs.batch_sharding)
      state, metrics = programs.train_step(state, batch)
      losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state["params"])


def test_two_microbatches_train_as_one_batch(few_optimizations):
  losses, params = _two_steps(accum=1)
  accumulated, params_accumulated = _two_steps(accum=2)
  np.testing.assert_allclose(accumulated, losses, rtol=0, atol=1e-5)
  flat = jax.tree_util.tree_leaves_with_path(params)
  other = jax.tree.leaves(params_accumulated)
  assert len(flat) == len(other)
  for (path, a), b in zip(flat, other):
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5,
                               err_msg=jax.tree_util.keystr(path))


def test_batch_work_counts_real_tokens_pairs_and_predictions():
  mask = np.zeros((2, 8), np.int32)
  mask[0, :5], mask[1, :8] = 1, 1
  weights = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  work = jax.tree.map(float, steps_lib.batch_work(dict(
      input_mask=jnp.asarray(mask), masked_lm_weights=jnp.asarray(weights))))
  assert work == dict(tokens=13.0, attended=5.0**2 + 8.0**2, predictions=3.0,
                      slots=16.0)
  # A packed row of sequences 3 and 4 (and one of 6) attends 9 + 16 (+ 36)
  # pairs, not 7^2: attention never crosses a sequence.
  ids = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 0, 0]],
                 np.int32)
  packed = jax.tree.map(float, steps_lib.batch_work(dict(
      input_mask=jnp.asarray(ids > 0), sequence_ids=jnp.asarray(ids),
      cls_positions=jnp.zeros((2, 2), jnp.int32))))
  assert packed == dict(tokens=13.0, attended=9.0 + 16.0 + 36.0,
                        predictions=0.0, slots=16.0)
