"""The cached-gradient step is the plain step, at a chunk's memory.

At a batch four times the chunk, the loss and every gradient of
``cached_gradients.gradients`` equal the plain step's (InfoNCE with a hard
negative, CoSENT); a whole train step gives the same state; naive chunks
(each chunk's own in-batch negatives, as gradient accumulation would have
them) give another loss, so the comparison can fail; XLA's memory analysis
of the compiled steps shows the cached step's temporaries are a fraction of
the plain step's.
"""

import jax
import numpy as np
import pytest

from bert_jax import compose
from bert_jax.training import cached_gradients
from bert_jax.training import compiled
from bert_jax.training import config_checks
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests.helpers import pairs as pair_fixtures

CHUNK = 4


def _programs(loss, chunk=0, batch=16):
  config = pair_fixtures.pairs_config(loss, chunk=chunk)
  config.train.batch_size = batch
  return steps_lib.Programs(config, sharding.make_mesh(config.mesh))


@pytest.mark.parametrize("loss", ["infonce", "cosent"])
def test_loss_and_gradients_equal_the_plain_steps(loss):
  programs = _programs(loss)
  config, objective = programs.config, programs.objective
  batch = pair_fixtures.pairs_batch(0)
  with programs.context():
    params = programs.init()["params"]
  plain_loss, plain = jax.value_and_grad(steps_lib.batch_loss)(
      params, batch, graphdef=programs.graphdef, config=config,
      objective=objective)
  config.train.cache_chunk_size = CHUNK
  counts = objective.counts(batch, config)
  grads, sums = jax.jit(lambda p, b: cached_gradients.gradients(
      p, b, jax.random.key(0), objective.counts(b, config),
      graphdef=programs.graphdef, objective=objective, config=config))(
          params, batch)
  np.testing.assert_allclose(float(objective.loss(sums, counts, config)),
                             float(plain_loss), rtol=1e-5)
  pair_fixtures.assert_same_gradients(grads, plain)
  # Naive chunks (negatives only within a chunk) are another loss.
  if loss == "infonce":
    naive = sum(float(steps_lib.batch_loss(
        params, {k: v[i::4] for k, v in batch.items()},
        graphdef=programs.graphdef, config=config, objective=objective))
                for i in range(4)) / 4
    assert abs(naive - float(plain_loss)) > 0.1


def test_a_cached_train_step_updates_as_the_plain_one(optimized):
  plain, cached = _programs("infonce"), _programs("infonce", chunk=CHUNK)
  batch = pair_fixtures.pairs_batch(1)
  out = []
  for programs in (plain, cached):
    with programs.context():
      state = programs.init()
      for _ in range(2):
        state, metrics = programs.train_step(
            state, sharding.global_batch(batch, programs.batch_sharding))
    out.append((float(metrics["loss"]), jax.device_get(state["params"])))
  np.testing.assert_allclose(out[1][0], out[0][0], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(out[0][1]), jax.tree.leaves(out[1][1])):
    np.testing.assert_allclose(b, a, atol=2e-6)


def test_the_cached_step_keeps_one_chunks_activations():
  """Batch 64: XLA's temporaries of the cached step (chunks of 4) against
  the plain step's."""
  temps = {}
  for chunk in (0, CHUNK):
    programs = _programs("infonce", chunk=chunk, batch=64)
    with programs.context():
      step = compiled.compile_ahead(programs.train_step,
                                    programs.abstract_state,
                                    programs.batch_spec(64))
    temps[chunk] = step.memory.temporaries
  assert temps[CHUNK] < temps[0] / 3, temps


def test_the_chunk_must_fit_the_batch_and_the_objective():
  config = pair_fixtures.pairs_config("infonce", chunk=5)
  with pytest.raises(ValueError, match="cache_chunk_size=5 must divide"):
    config_checks.validate(config, 1, 1, check_sources=False)
  config = pair_fixtures.pairs_config("infonce", chunk=4)
  config.objective.name = "bert"
  with pytest.raises(ValueError, match="is no loss over per-example vectors"):
    cached_gradients.check(config, compose.objective(config), 1)
