"""Mixed precision: fp32 parameters, bf16 compute, dtype-safe attention masks.

Tolerance for bf16 vs fp32 (stated here, asserted below): on the same
parameters and batch the initial loss agrees within 1% relative, and the
gradients point the same way (cosine similarity > 0.99). bf16 keeps 8
mantissa bits (relative step 2^-8 ~ 0.4%); matmuls accumulate in fp32 and
softmax, LayerNorm and the loss run in fp32, so errors do not compound.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from bert_jax import families
from bert_jax.models import attention as attention_lib
from bert_jax.models import bert
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests import helpers

LOSS_RTOL = 1e-2
GRAD_COSINE = 0.99
BATCH = 8  # Seq 32, 5 predictions, vocab 256: helpers.sharded_config.


def tiny_config(dtype="float32", attention_impl=None
                ) -> ml_collections.ConfigDict:
  """The multi-device tests' config at batch 8 in `dtype`."""
  model = dict(dtype=dtype)
  if attention_impl is not None:
    model.update(attention_impl=attention_impl)
  return helpers.sharded_config(model=model, train=dict(batch_size=BATCH))


def batch(seed=0, fully_padded_rows=()):
  return helpers.synthetic_batch(seed, batch=BATCH, two_segments=False,
                                 fully_padded_rows=fully_padded_rows)


@functools.lru_cache(maxsize=1)
def _params():
  """fp32 parameters, created once and shared by every dtype's model."""
  return nnx.state(
      bert.BertForPreTraining(tiny_config().model, rngs=nnx.Rngs(0)),
      nnx.Param)


def make_model(config):
  graphdef = nnx.split(steps_lib.abstract_model(config), nnx.Param)[0]
  return nnx.merge(graphdef, _params())


def _impls():
  impls = ["xla"]
  if "dot_product_attention" in getattr(bert, "ATTENTION_IMPLS", ()):
    impls.append("dot_product_attention")
  return impls


def test_mask_bias_is_finite_in_bf16():
  bias = float(jnp.asarray(attention_lib.MASK_BIAS, jnp.bfloat16))
  assert np.isfinite(bias) and bias <= -1e4


@pytest.mark.parametrize("impl", _impls())
def test_fully_padded_row_gives_finite_outputs_in_bf16(impl):
  dtype = "bfloat16"
  config = tiny_config(dtype, impl)
  b = batch(fully_padded_rows=(0, 3))
  out = jax.jit(lambda m, b: m(b["input_ids"], b["input_mask"],
                               b["segment_ids"], b["masked_lm_positions"])
                )(make_model(config), b)
  for name, x in out.items():
    assert np.all(np.isfinite(np.asarray(x, np.float32))), (name, dtype, impl)


def test_padding_does_not_leak_into_real_tokens():
  """Changing padded tokens leaves bf16 outputs at real positions unchanged."""
  config = tiny_config("bfloat16")
  model = make_model(config)
  b = batch(seed=1)
  other = dict(b, input_ids=np.where(b["input_mask"] > 0, b["input_ids"],
                                     7).astype(np.int32))
  run = jax.jit(lambda m, b: m(b["input_ids"], b["input_mask"],
                               b["segment_ids"])["sequence_output"])
  a = np.asarray(run(model, b), np.float32)
  c = np.asarray(run(model, other), np.float32)
  real = b["input_mask"] > 0
  np.testing.assert_array_equal(a[real], c[real])
  assert not np.array_equal(a[~real], c[~real])  # Padded rows did change.


def test_compute_dtype_is_bf16_and_outputs_are_fp32():
  config = tiny_config("bfloat16")
  model = make_model(config)
  b = batch()
  out = jax.eval_shape(lambda m: m(b["input_ids"], b["input_mask"],
                                   b["segment_ids"], b["masked_lm_positions"]),
                       model)
  assert out["sequence_output"].dtype == jnp.bfloat16
  assert out["mlm_logits"].dtype == jnp.float32
  for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)):
    assert leaf.dtype == jnp.float32


def _loss_and_grads(config, params, b):
  graphdef = nnx.split(steps_lib.abstract_model(config), nnx.Param)[0]
  objective = families.objective("bert")

  def loss(p):
    return steps_lib.batch_loss(p, b, graphdef=graphdef, config=config,
                            objective=objective)

  return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.slow
def test_bf16_loss_and_gradients_match_fp32():
  params = _params().to_pure_dict()
  b = batch(seed=2)
  loss32, g32 = _loss_and_grads(tiny_config("float32"), params, b)
  loss16, g16 = _loss_and_grads(tiny_config("bfloat16"), params, b)
  assert float(loss32) > 1.0
  np.testing.assert_allclose(float(loss16), float(loss32), rtol=LOSS_RTOL)
  a = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g32)])
  c = np.concatenate([np.ravel(x) for x in jax.tree.leaves(g16)])
  assert c.dtype == np.float32  # Gradients of fp32 params are fp32.
  cosine = float(a @ c / (np.linalg.norm(a) * np.linalg.norm(c)))
  assert cosine > GRAD_COSINE, cosine


@pytest.mark.slow
def test_bf16_training_keeps_fp32_state_and_learns():
  config = tiny_config("bfloat16")
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  programs = steps_lib.Programs(config, mesh)
  b = batch(seed=3)
  with programs.context():
    state = programs.init()
    losses = []
    for _ in range(6):  # The same batch: the loss must go down.
      state, metrics = programs.train_step(
          state, sharding.global_batch(b, programs.batch_sharding))
      losses.append(float(metrics["loss"]))
  assert np.all(np.isfinite(losses))
  assert losses[-1] < losses[0] - 0.05, losses
  for leaf in jax.tree.leaves((state["params"], state["opt_state"])):
    if jnp.issubdtype(leaf.dtype, jnp.floating):
      assert leaf.dtype == jnp.float32
