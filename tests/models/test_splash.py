"""Splash attention (model.attention_impl="splash") against XLA attention.

The kernel runs in the Pallas interpreter on CPU (model.splash_interpret),
so these check its numerics, the padding-as-segment-ids mapping and the
fully padded row, not its TPU speed.
"""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import config_lib
from bert_jax.models import attention as attention_lib
from bert_jax.models import splash
from bert_jax.training import config_checks
from tests import helpers

SEQ, HEADS, HEAD_DIM = 128, 2, 64


def _config(impl, **overrides):
  c = config_lib.model_config("tiny")
  c.update(vocab_size=211, hidden_size=HEADS * HEAD_DIM, num_hidden_layers=1,
           num_attention_heads=HEADS, intermediate_size=256,
           max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
           attention_probs_dropout_prob=0.0, dtype="float32",
           attention_impl=impl, splash_interpret=True)
  c.update(overrides)
  return c


def _mask():
  """Row 0 full, row 1 padded after 77 tokens, row 2 fully padded."""
  mask = np.ones((3, SEQ), np.int32)
  mask[1, 77:] = 0
  mask[2, :] = 0
  return jnp.asarray(mask)


def _layer_pair():
  """One SelfAttention per kind with identical parameters."""
  xla = attention_lib.SelfAttention(_config("xla"), rngs=nnx.Rngs(0))
  spl = attention_lib.SelfAttention(_config("splash"), rngs=nnx.Rngs(0))
  return xla, spl


def test_forward_and_gradients_match_xla_with_padding():
  xla, spl = _layer_pair()
  x = jax.random.normal(jax.random.key(1), (3, SEQ, HEADS * HEAD_DIM))
  bias = attention_lib.padding_mask(_mask())
  # Loss weights on every output position except the fully padded row:
  # there XLA's forward is uniform (every score rounds to -1e9) yet its
  # softmax backward passes a gradient into q/k, while splash's output is
  # the mean of v and has none. The objectives' weights keep padding out of
  # the loss, so neither reaches the parameters in training.
  w = jax.random.normal(jax.random.key(2), x.shape).at[2].set(0.0)

  def loss(layer, x):
    y = layer(x, bias, deterministic=True, rngs=None)
    return jnp.sum(y * w), y

  step = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True))
  (lx, yx), (gx_params, gx_x) = step(xla, x)
  (ls, ys), (gs_params, gs_x) = step(spl, x)
  np.testing.assert_allclose(ls, lx, rtol=1e-6)
  # Every position, padded ones and the fully padded row included.
  print("max |splash - xla|: output", float(jnp.max(jnp.abs(ys - yx))),
        "d/dx", float(jnp.max(jnp.abs(gs_x - gx_x))))
  np.testing.assert_allclose(ys, yx, atol=1e-5, rtol=0)
  assert np.isfinite(np.asarray(ys[2])).all()
  np.testing.assert_allclose(gs_x, gx_x, atol=1e-5, rtol=0)
  for (path, a), (_, b) in zip(
      jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(gs_params)),
      jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(gx_params))):
    scale = max(1.0, float(jnp.max(jnp.abs(b))))
    np.testing.assert_allclose(a / scale, b / scale, atol=1e-5, rtol=0,
                               err_msg=jax.tree_util.keystr(path))


def test_real_queries_never_see_padded_keys():
  """Changing v at padded keys leaves every output of row 1 unchanged."""
  key = jax.random.split(jax.random.key(3), 3)
  q, k, v = (jax.random.normal(s, (3, SEQ, HEADS, HEAD_DIM)) for s in key)
  mask = _mask()
  attend = jax.jit(lambda v: splash.attention(q, k, v, mask, interpret=True))
  out = attend(v)
  out2 = attend(v.at[1, 77:].set(1e3))
  np.testing.assert_array_equal(out[1], out2[1])
  np.testing.assert_array_equal(out[0], out2[0])


def test_tpu_only_without_interpret():
  if jax.default_backend() == "tpu":
    pytest.skip("On TPU the kernel runs for real.")
  q = jnp.zeros((1, SEQ, HEADS, HEAD_DIM))
  with pytest.raises(ValueError, match="TPU kernel.*attention_impl='xla'"):
    splash.attention(q, q, q, jnp.ones((1, SEQ)))


def test_attention_dropout_is_refused_in_training():
  layer = attention_lib.SelfAttention(
      _config("splash", attention_probs_dropout_prob=0.1), rngs=nnx.Rngs(0))
  x = jnp.zeros((1, SEQ, HEADS * HEAD_DIM))
  bias = attention_lib.padding_mask(jnp.ones((1, SEQ)))
  with pytest.raises(ValueError, match="attention_probs_dropout_prob=0"):
    layer(x, bias, deterministic=False, rngs=nnx.Rngs(0))


def test_config_check_needs_seq_multiple_of_128():
  c = config_lib.get_config("tiny")
  c.model.update(attention_impl="splash", attention_probs_dropout_prob=0.0)
  c.data.seq_length = 64
  c.mesh.update(data=1, fsdp=1, tensor=1)
  with pytest.raises(ValueError, match="data.seq_length"):
    config_checks.validate(c, num_devices=1, check_sources=False)
  c.data.seq_length = 128
  c.model.max_position_embeddings = 128
  config_checks.validate(c, num_devices=1, check_sources=False)


def _sharded_child():
  """8 CPU devices, data=2 x fsdp=2 x tensor=2: shard_map over batch/heads."""
  from bert_jax.training import sharding
  mesh_config = config_lib.get_config("tiny").mesh
  mesh_config.update(data=2, fsdp=2, tensor=2)
  mesh = sharding.make_mesh(mesh_config, jax.devices())
  key = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(s, (4, SEQ, HEADS, HEAD_DIM)) for s in key)
  mask = np.ones((4, SEQ), np.int32)
  mask[1, 50:] = 0
  mask[3] = 0
  attend = jax.jit(lambda *a: splash.attention(*a, interpret=True))
  single = attend(q, k, v, mask)
  with sharding.logical_context(mesh, sharding.rules(mesh_config)):
    sharded = attend(q, k, v, mask)
  assert len(sharded.sharding.device_set) == 8, sharded.sharding
  np.testing.assert_allclose(sharded, single, atol=1e-6, rtol=0)


@pytest.mark.slow
def test_sharded_matches_single_device():
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  repo = helpers.REPO
  proc = subprocess.run([sys.executable, "-m", "tests.models.test_splash", "child"],
                        cwd=repo, env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]


if __name__ == "__main__":
  _sharded_child()
