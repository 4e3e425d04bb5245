"""Optimizer: schedule shape, decay mask, clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
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


# ------------------------------------------------------------------------------
# StableAdamW and warmup-stable-decay (ModernBERT's recipe), by hand.
# ------------------------------------------------------------------------------
def _stable_adamw_by_hand(grads, params, lr, b1, b2, eps, wd, decays):
  """optimi's StableAdamW written out in numpy, float64: per tensor,
  lr_t = lr / max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))), then AdamW's
  step and decoupled decay at lr_t. Returns the per-step updates and RMS
  ratios."""
  m = {k: np.zeros_like(p) for k, p in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  p = {k: x.copy() for k, x in params.items()}
  out, ratios = [], []
  for t, g in enumerate(grads, start=1):
    step, ratio = {}, {}
    for k in p:
      m[k] = b1 * m[k] + (1 - b1) * g[k]
      v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
      m_hat, v_hat = m[k] / (1 - b1 ** t), v[k] / (1 - b2 ** t)
      rms = ratio[k] = np.sqrt(np.mean(g[k] ** 2 / np.maximum(v_hat,
                                                               eps ** 2)))
      lr_t = lr / max(1.0, rms)
      step[k] = -lr_t * (m_hat / (np.sqrt(v_hat) + eps)
                         + (wd * p[k] if decays[k] else 0.0))
      p[k] = p[k] + step[k]
    out.append(step)
    ratios.append(ratio)
  return out, ratios


def test_stable_adamw_equals_the_hand_computed_updates():
  """Three steps on a small tree; the third gradient of `w` jumps 30x, so
  its RMS ratio exceeds 1 and its step shrinks; `bias` takes no decay. No
  global-norm clipping (max_grad_norm is StableAdamW's to ignore)."""
  r = np.random.RandomState(0)
  params = {"w": r.normal(size=(3, 4)), "bias": r.normal(size=(4,))}
  grads = [{k: r.normal(size=x.shape) for k, x in params.items()}
           for _ in range(3)]
  grads[2]["w"] = grads[2]["w"] * 30.0
  hp = dict(lr=0.01, b1=0.9, b2=0.98, eps=1e-6, wd=0.1)
  want, ratios = _stable_adamw_by_hand(grads, params, **hp,
                                       decays={"w": True, "bias": False})
  # Step 1's ratio is 1 exactly; the spike's is far above, bias's below.
  assert ratios[2]["w"] > 1.5 and ratios[2]["bias"] <= 1.0, ratios
  tx = optim.make_optimizer(_train(
      optimizer="stable_adamw", learning_rate=hp["lr"], warmup_steps=0,
      schedule="wsd", num_steps=10, adam_b1=hp["b1"], adam_b2=hp["b2"],
      adam_eps=hp["eps"], weight_decay=hp["wd"], max_grad_norm=1e-3))
  p = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  state, update = tx.init(p), jax.jit(tx.update)
  for g, expected in zip(grads, want):
    g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), g)
    updates, state = update(g, state, p)
    for k in params:
      np.testing.assert_allclose(updates[k], expected[k], rtol=2e-5,
                                 atol=1e-9, err_msg=k)
    p = jax.tree.map(lambda a, u: a + u, p, updates)


def test_stable_adamw_is_adamw_while_no_tensor_clips():
  """With gradients of steady size the RMS ratio stays <= 1: the updates
  are optax.adamw's (with the same decay mask)."""
  r = np.random.RandomState(1)
  params = {"dense": {"kernel": jnp.asarray(r.normal(size=(4, 4)),
                                            jnp.float32)}}
  train = dict(learning_rate=1e-2, warmup_steps=0, num_steps=100,
               weight_decay=0.05, adam_b2=0.9)
  stable = optim.make_optimizer(_train(optimizer="stable_adamw", **train))
  adamw = optax.adamw(optim.learning_rate_schedule(_train(**train)), b1=0.9,
                      b2=0.9, eps=1e-6, weight_decay=0.05)
  s1, s2 = stable.init(params), adamw.init(params)
  g = jax.tree.map(jnp.ones_like, params)
  for _ in range(3):
    u1, s1 = jax.jit(stable.update)(g, s1, params)
    u2, s2 = jax.jit(adamw.update)(g, s2, params)
    np.testing.assert_allclose(u1["dense"]["kernel"], u2["dense"]["kernel"],
                               rtol=1e-6)


@pytest.mark.parametrize("shape, at_90", [("linear", 5e-4),
                                          ("1-sqrt", 1e-3 * (1 - 0.5 ** 0.5))])
def test_warmup_stable_decay_by_hand(shape, at_90):
  """Peak 1e-3, warmup 10, the last 20 of 100 steps decay to 0."""
  sched = optim.learning_rate_schedule(_train(
      learning_rate=1e-3, warmup_steps=10, num_steps=100, schedule="wsd",
      decay_steps=20, decay_shape=shape))
  want = {0: 0.0, 5: 5e-4, 10: 1e-3, 50: 1e-3, 80: 1e-3, 90: at_90,
          100: 0.0, 120: 0.0}
  for step, lr in want.items():
    np.testing.assert_allclose(float(sched(step)), lr, atol=1e-10,
                               err_msg=str(step))


def test_wsd_rejects_a_decay_longer_than_the_run():
  with pytest.raises(ValueError, match=r"train.decay_steps=95 must be in"):
    optim.make_optimizer(_train(schedule="wsd", warmup_steps=10,
                                num_steps=100, decay_steps=95))
  with pytest.raises(ValueError, match="train.schedule='cosine'"):
    optim.make_optimizer(_train(schedule="cosine"))


def test_modernbert_norms_take_no_weight_decay():
  params = {"model": {"final_norm": {"scale": 1.0},
                      "embeddings": {"norm": {"scale": 1.0},
                                     "tok_embeddings": 1.0},
                      "layers": {1: {"attn_norm": {"scale": 1.0},
                                     "attn": {"wqkv": 1.0}}}},
            "decoder": {"bias": 1.0}}
  mask = optim.decay_mask(params)
  assert mask["model"]["final_norm"]["scale"] is False
  assert mask["model"]["embeddings"] == {"norm": {"scale": False},
                                         "tok_embeddings": True}
  assert mask["model"]["layers"][1] == {"attn_norm": {"scale": False},
                                        "attn": {"wqkv": True}}
  assert mask["decoder"]["bias"] is False
