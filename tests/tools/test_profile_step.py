"""tools/profile_step.py: the optimized HLO read back (dot FLOPs, Python
stacks) and a ModernBERT step's time split by part of the model."""

import jax
import jax.numpy as jnp
import pytest

from tests import helpers

profile_step = helpers.import_tool("profile_step")


def _dense(x, w):
  return x @ w


def _mlp(x, w1, w2):
  return _dense(jnp.tanh(_dense(x, w1)), w2)


def test_hlo_gives_dot_flops_and_whole_python_stacks():
  m, k = 8, 16
  step = jax.jit(_mlp)
  args = [jnp.ones((m, k)), jnp.ones((k, 2 * k)), jnp.ones((2 * k, k))]
  hlo = profile_step.Hlo(step.lower(*args).compile().as_text())
  dots = [n for n, i in hlo.instructions.items() if i["opcode"] == "dot"]
  assert len(dots) == 2
  assert sum(hlo.dot_flops(n) for n in dots) == 2 * (2 * m * k * 2 * k)
  for n in dots:
    functions = [fn for _, fn, _ in hlo.stack(hlo.instructions[n]["frame"])]
    assert functions[:2] == ["_dense", "_mlp"], functions
    assert "test_hlo_gives_dot_flops_and_whole_python_stacks" in functions


@pytest.fixture(scope="module")
def modernbert_profile():
  from tests.helpers import family_checks
  config = family_checks.family_config("modernbert")  # 3 layers, window 8.
  return config, profile_step.profile(config, steps=1, warmup=0)


def test_modernbert_step_splits_into_its_parts(modernbert_profile):
  config, r = modernbert_profile
  parts = {p["part"] for p in r["parts"]}
  assert {"attention: sliding window", "attention: full",
          "attention: projections", "MLP", "MLM head", "MLM loss",
          "embeddings", "layer norms", "optimizer"} <= parts, parts
  directions = {(p["part"], p["direction"]) for p in r["parts"]}
  assert {("MLP", "forward"), ("MLP", "backward")} <= directions
  assert sum(p["share"] for p in r["parts"]) == pytest.approx(1.0)
  assert r["op_ms_per_step"] > 0 and r["step_ms_p50"] > 0
  report = profile_step.format_report(r, 5)
  assert "attention: sliding window" in report and "GFLOP/s" in report


def test_matmul_flops_read_from_the_hlo_equal_the_analytic_count(
    modernbert_profile):
  from bert_jax import compose
  config, r = modernbert_profile
  analytic = compose.train_flops_per_step(config) / 1e9
  assert r["dot_gflop_per_step"] == pytest.approx(analytic, rel=0.01)
  mlp = sum(p["gflop"] for p in r["parts"] if p["part"] == "MLP")
  m = config.model
  tokens = config.train.batch_size * config.data.seq_length
  # GeGLU: Wi (d -> 2 x FFN) and Wo (FFN -> d), forward x 3 with backward.
  assert mlp == pytest.approx(3 * 2 * tokens * 3 * m.hidden_size
                              * m.intermediate_size * m.num_hidden_layers
                              / 1e9, rel=1e-6)


def test_task_profiles_the_fine_tuning_step_on_its_packed_rows(tmp_path):
  """--task: the fine-tuning run's step (its checkpoint's architecture, the
  task's classifier) on the task's own packed rows."""
  from tests.helpers import tiny_models
  hf = tiny_models.make_hf_dir(str(tmp_path / "base"))
  train, dev = tiny_models.write_keyword_task(str(tmp_path / "task"),
                                              n_train=64, n_dev=8)
  config = tiny_models.finetune_config(hf["out"], train, dev)
  config.data.update(packing=True, packing_max_sequences=8)
  config.train.batch_size = 2
  r = profile_step.profile(config, steps=1, warmup=0, task=True)
  assert r["model"].startswith("classify 2x64")
  assert r["batch"] == "2 x 32 (packed task rows)"
  parts = {p["part"] for p in r["parts"]}
  assert {"MLP", "attention: full", "optimizer"} <= parts, parts
