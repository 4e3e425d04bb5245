"""Optimizer: schedule shape, decay mask, clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax.training import optim


def _train(**kw):
  t = config_lib.train_config()
  t.update(kw)
  return t


def test_schedule_warms_up_linearly_then_decays_to_zero():
  sched = optim.learning_rate_schedule(
      _train(learning_rate=1e-3, warmup_steps=10, num_steps=110))
  assert float(sched(0)) == 0.0
  np.testing.assert_allclose(float(sched(5)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(sched(10)), 1e-3, rtol=1e-6)
  np.testing.assert_allclose(float(sched(60)), 5e-4, rtol=1e-6)
  np.testing.assert_allclose(float(sched(110)), 0.0, atol=1e-12)


def test_no_weight_decay_on_layer_norm_and_biases():
  params = {"layers": {0: {"dense": {"kernel": 1.0, "bias": 1.0},
                           "layer_norm": {"scale": 1.0, "bias": 1.0}}},
            "word_embeddings": 1.0}
  mask = optim.decay_mask(params)
  assert mask["layers"][0]["dense"] == {"kernel": True, "bias": False}
  assert mask["layers"][0]["layer_norm"] == {"scale": False, "bias": False}
  assert mask["word_embeddings"] is True


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_decay_applies_to_kernels_only(name):
  tx = optim.make_optimizer(_train(optimizer=name, learning_rate=0.1,
                                   warmup_steps=0, num_steps=10,
                                   weight_decay=0.5))
  params = {"dense": {"kernel": jnp.ones((2, 2)), "bias": jnp.ones((2,))}}
  zero = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero, tx.init(params), params)
  assert float(jnp.abs(updates["dense"]["kernel"]).sum()) > 0
  assert float(jnp.abs(updates["dense"]["bias"]).sum()) == 0



def test_gradients_are_clipped_to_max_norm():
  """A gradient spike is clipped to norm 1 before Adam sees it, so Adam's
  second moment does not explode and the next ordinary step still moves."""
  tx = optim.make_optimizer(_train(optimizer="adamw", max_grad_norm=1.0,
                                   learning_rate=1.0, warmup_steps=0,
                                   num_steps=1000, weight_decay=0.0))
  params = {"w": jnp.zeros((4,))}
  state = tx.init(params)
  _, state = tx.update({"w": jnp.full((4,), 1e6)}, state, params)
  update, _ = tx.update({"w": jnp.full((4,), 0.5)}, state, params)
  # Clipped: both gradients are 0.5 per element -> |update| ~ lr = 1.
  # Unclipped, the spike's second moment would shrink it to ~5e-7.
  assert float(jnp.abs(update["w"]).min()) > 0.5


def test_unknown_optimizer_is_rejected():
  with pytest.raises(ValueError, match="train.optimizer='sgd'"):
    optim.make_optimizer(_train(optimizer="sgd"))
