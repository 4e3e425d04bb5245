"""train.ema_decay: the params' moving average in the train state, and
`python -m bert_jax.average --ema` writing a step's average as a workdir."""

import numpy as np
import pytest

from tests import helpers


def _flat(tree):
  import jax
  return {jax.tree_util.keystr(p): np.asarray(x, np.float64)
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_ema_follows_the_updates_and_skips_a_dropped_one(tmp_path):
  """ema_0 = params_0; after each applied update ema = 0.9 ema + 0.1
  params; a non-finite step (dropped) leaves it as it was. Saved with the
  step, `average --ema` writes it as the params of a workdir, bit for
  bit."""
  import jax

  from bert_jax import average
  from bert_jax.checkpoints import manager
  from bert_jax.checkpoints import reading
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  config = helpers.sharded_config(num_steps=4, train=dict(ema_decay=0.9))
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  batches = [helpers.synthetic_batch(i) for i in range(4)]
  batches[2]["masked_lm_weights"][0, 0] = np.nan
  with programs.context():
    state = programs.init()
    expected = _flat(jax.device_get(state["params"]))
    ema = _flat(jax.device_get(state["ema"]))
    for k, v in expected.items():
      np.testing.assert_array_equal(ema[k], v, err_msg=k)
    for i, local in enumerate(batches):
      state, metrics = programs.train_step(
          state, sharding.global_batch(local, programs.batch_sharding))
      assert bool(metrics["finite"]) == (i != 2)
      params = _flat(jax.device_get(state["params"]))
      if i != 2:
        expected = {k: 0.9 * v + 0.1 * params[k] for k, v in expected.items()}
      ema = _flat(jax.device_get(state["ema"]))
      for k, v in expected.items():
        np.testing.assert_allclose(ema[k], v, rtol=1e-5, atol=1e-7, err_msg=k)
    assert not np.allclose(ema[k], params[k])  # An average, not the params.
  workdir = str(tmp_path / "run")
  ckpt = manager.Checkpointer(workdir, config.checkpoint)
  ckpt.save(4, state, meta=dict(config=config.to_dict()), force=True)
  ckpt.wait()
  ckpt.close()
  out = str(tmp_path / "ema")
  assert average.main(["--workdir", workdir, "--steps", "4", "--ema",
                       "--output", out]) == 0
  written = _flat(reading.load_params(out)[0])
  saved = _flat(jax.device_get(state["ema"]))
  assert sorted(written) == sorted(saved)
  for k in saved:
    assert np.array_equal(written[k].astype(np.float32),
                          saved[k].astype(np.float32)), k


def test_ema_of_a_run_without_one_is_refused(tmp_path, capsys):
  import jax  # noqa: F401

  from bert_jax import average
  from bert_jax.checkpoints import manager
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  config = helpers.sharded_config(num_steps=1)
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  with programs.context():
    state = programs.init()
  assert "ema" not in state
  workdir = str(tmp_path / "run")
  ckpt = manager.Checkpointer(workdir, config.checkpoint)
  ckpt.save(1, state, meta=dict(config=config.to_dict()), force=True)
  ckpt.wait()
  ckpt.close()
  out = tmp_path / "ema"
  assert average.main(["--workdir", workdir, "--steps", "1", "--ema",
                       "--output", str(out)]) == 1
  assert capsys.readouterr().err == (
      f"error: Step 1 of {workdir} holds no moving average ('ema'): its run "
      "had train.ema_decay=0.\n")
  assert not out.exists()


def test_ema_decay_out_of_range_is_one_line():
  from bert_jax.training import config_checks
  with pytest.raises(ValueError, match=r"^train.ema_decay=1.0 must be in "
                     r"\[0, 1\) \(0: no moving average\)\.$"):
    config_checks.validate(helpers.tiny_config(train=dict(ema_decay=1.0)),
                           num_devices=1, check_sources=False)
