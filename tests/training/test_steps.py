"""The train step's update: a non-finite step changes nothing but its
counters, and the optimizer state is updated in place (no per-step copy of
the Adam moments, whose cost does not shrink with the batch)."""

import re

import jax
import numpy as np

from bert_jax.training import compiled
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests import helpers


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
