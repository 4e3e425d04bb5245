"""training/steps.py on one device: gradient accumulation is one large
batch; the work a batch counts (tokens, attended pairs, predictions) is its
real content; a non-finite step changes nothing but its counters, and the
optimizer state is updated in place (no per-step copy of the Adam moments,
whose cost does not shrink with the batch). (The same on 8 simulated
devices and every mesh is test_sharding's, in the slow tier.)"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.training import compiled
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


def _programs():
  config = helpers.sharded_config()
  return steps_lib.Programs(config, sharding.make_mesh(config.mesh))


def test_a_nonfinite_step_changes_no_weight_and_no_optimizer_state():
  p = _programs()
  batch = sharding.global_batch(helpers.synthetic_batch(0), p.batch_sharding)
  with p.context():
    state = p.init()
    state, metrics = p.train_step(state, batch)  # Finite: moments move.
    assert bool(metrics["finite"])
    before = jax.device_get(state)
    params = jax.tree.map(np.copy, before["params"])
    params["bert"]["pooler"]["bias"][0] = np.nan  # Every loss is NaN.
    state = dict(state, params=jax.device_put(
        params, p.state_sharding["params"]))
    state, metrics = p.train_step(state, batch)
  after = jax.device_get(state)
  assert not bool(metrics["finite"])
  assert int(after["step"]) == 2 and int(after["nonfinite_steps"]) == 1
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(params),
                          jax.tree.leaves(after["params"])):
    np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))
  for a, b in zip(jax.tree.leaves(before["opt_state"]),
                  jax.tree.leaves(after["opt_state"])):
    np.testing.assert_array_equal(a, b)


def test_the_step_updates_the_optimizer_moments_in_place():
  p = _programs()
  with p.context():
    step = compiled.compile_ahead(p.train_step, p.abstract_state,
                                  p.batch_spec(helpers.BATCH))
  text = step.executable.as_text()
  moments = re.findall(r"= \S+ copy\(\S*opt_state\S*(?:mu|nu)\S*\)", text)
  assert "opt_state" in text and not moments, moments[:3]
