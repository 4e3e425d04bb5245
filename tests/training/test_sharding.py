"""Mesh, logical-axis rules and sharded training: the numbers do not move.

The multi-device checks run once, in a subprocess that sees 8 simulated CPU
devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8`` has to be set
before jax is imported): the same 3 training steps on 1 device and on DP=8,
FSDP=8, DP=4 x TP=2 and DP=2 x FSDP=2 x TP=2 give the same losses, gradients
and parameters (fp32, dropout off), FSDP/TP really split the state, and
gradient accumulation matches one large batch. The child writes an .npz the
tests below read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers
from tests.helpers import REPO
from tests.helpers import sharded_config

SEED = 1000  # Step i trains on helpers.synthetic_batch(SEED + i).
TOL = 1e-5
STEPS = 3
# name -> ((data, fsdp, tensor), grad_accum_steps). "single" runs on 1 device.
RUNS = {
    "single": ((1, 1, 1), 1),
    "dp8": ((8, 1, 1), 1),
    "fsdp8": ((1, 8, 1), 1),
    "dp4_tp2": ((4, 1, 2), 1),
    "dp2_fsdp2_tp2": ((2, 2, 2), 1),
    # Accumulation: 2 microbatches of 8 vs the one batch of 16 above.
    "fsdp8_accum2": ((1, 8, 1), 2),
}


# ------------------------------------------------------------------------------
# Helpers shared with the child process.
# ------------------------------------------------------------------------------
def _flat(tree) -> dict:
  import jax
  return {jax.tree_util.keystr(p): np.asarray(jax.device_get(x))
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _device0_fraction(tree) -> float:
  """Bytes of `tree` held on the first device / bytes of the whole tree."""
  import jax
  leaves = jax.tree.leaves(tree)
  dev = leaves[0].sharding.mesh.devices.flat[0]
  total = sum(x.nbytes for x in leaves)
  local = sum(s.data.nbytes for x in leaves for s in x.addressable_shards
              if s.device == dev)
  return local / total


def grads_program(programs):
  """jit(grad(loss)) with the same shardings and loss as the train step."""
  import jax

  from bert_jax.training import steps as steps_lib

  def grads(params, batch):
    return jax.grad(lambda p: steps_lib.batch_loss(
        p, batch, graphdef=programs.graphdef, config=programs.config,
        objective=programs.objective))(params)

  params_sharding = programs.state_sharding["params"]
  return jax.jit(grads, in_shardings=(params_sharding,
                                      programs.batch_sharding),
                 out_shardings=params_sharding)


def child_main(out_path: str) -> None:
  import jax

  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib

  assert jax.device_count() == 8, jax.devices()
  out = {}
  for name, (shape, accum) in RUNS.items():
    config = sharded_config(*shape, accum=accum)
    devices = jax.devices()[:int(np.prod(shape))]
    mesh = sharding.make_mesh(config.mesh, devices)
    programs = steps_lib.Programs(config, mesh)
    with programs.context():
      state = programs.init()
      out[f"{name}/param_fraction"] = _device0_fraction(state["params"])
      out[f"{name}/opt_fraction"] = _device0_fraction(state["opt_state"])
      specs = {k: [a if a is None or isinstance(a, str) else list(a)
                   for a in v.spec]
               for k, v in _flat_shardings(state["params"]).items()}
      out[f"{name}/specs"] = np.array(json.dumps(specs))
      if accum == 1:
        g = grads_program(programs)(
            state["params"],
            sharding.global_batch(helpers.synthetic_batch(SEED),
                                  programs.batch_sharding))
        for k, v in _flat(g).items():
          out[f"{name}/grads/{k}"] = v
      losses, norms = [], []
      for step in range(STEPS):
        batch = sharding.global_batch(helpers.synthetic_batch(SEED + step),
                                      programs.batch_sharding)
        state, metrics = programs.train_step(state, batch)
        losses.append(float(metrics["loss"]))
        norms.append(float(metrics["grad_norm"]))
      out[f"{name}/loss"] = np.array(losses)
      out[f"{name}/grad_norm"] = np.array(norms)
      for k, v in _flat(state["params"]).items():
        out[f"{name}/params/{k}"] = v
  np.savez(out_path, **out)


def _flat_shardings(tree) -> dict:
  import jax
  return {jax.tree_util.keystr(p): x.sharding
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def run_child(args: list[str], devices: int = 8, timeout: int = 600,
              extra_env: dict | None = None) -> subprocess.CompletedProcess:
  env = helpers.child_env(devices, **(extra_env or {}))
  proc = subprocess.run([sys.executable, os.path.abspath(__file__)] + args,
                        env=env, cwd=REPO, capture_output=True, text=True,
                        timeout=timeout)
  if proc.returncode:
    raise AssertionError(f"child {args} failed ({proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
  return proc


# ------------------------------------------------------------------------------
# Multi-device runs (one subprocess, 8 CPU devices).
# ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("sharding") / "runs.npz")
  # XLA warnings on (level 1) and no compilation cache (a cached program is
  # not partitioned again, so it would not warn): the rematerialization
  # check reads them.
  proc = run_child(["child", path], extra_env={"TF_CPP_MIN_LOG_LEVEL": "1",
                                               "JAX_COMPILATION_CACHE_DIR": ""})
  data = np.load(path)
  return dict({k: data[k] for k in data.files}, stderr=proc.stderr)


def _prefixed(runs, name, prefix):
  start = f"{name}/{prefix}"
  return {k[len(start):]: v for k, v in runs.items() if k.startswith(start)}


def _max_abs_diff(a: dict, b: dict) -> tuple[float, str]:
  assert a.keys() == b.keys() and a, (sorted(a)[:3], sorted(b)[:3])
  worst = max(a, key=lambda k: np.max(np.abs(a[k] - b[k])))
  return float(np.max(np.abs(a[worst] - b[worst]))), worst


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp8", "fsdp8", "dp4_tp2", "dp2_fsdp2_tp2"])
def test_mesh_matches_single_device(runs, name):
  ref_loss, loss = runs["single/loss"], runs[f"{name}/loss"]
  assert ref_loss.shape == (STEPS,) and np.all(np.isfinite(ref_loss))
  np.testing.assert_allclose(loss, ref_loss, rtol=0, atol=TOL)
  np.testing.assert_allclose(runs[f"{name}/grad_norm"],
                             runs["single/grad_norm"], rtol=TOL, atol=TOL)
  diff, where = _max_abs_diff(_prefixed(runs, name, "grads/"),
                              _prefixed(runs, "single", "grads/"))
  assert diff <= TOL, f"{name}: gradient {where} differs by {diff:.2e}"
  diff, where = _max_abs_diff(_prefixed(runs, name, "params/"),
                              _prefixed(runs, "single", "params/"))
  assert diff <= TOL, (f"{name}: parameter {where} after {STEPS} steps "
                       f"differs by {diff:.2e}")


@pytest.mark.slow
def test_no_mesh_makes_xla_replicate_a_sharded_tensor(runs):
  """XLA warns when a layout change can only be done by replicating the
  whole tensor (it did for the embedding lookups on data x fsdp x tensor)."""
  assert "Involuntary full rematerialization" not in runs["stderr"], (
      runs["stderr"][-3000:])


@pytest.mark.slow
def test_training_moves_the_parameters(runs):
  """Guards the equivalence test against comparing untrained copies."""
  start = _prefixed(runs, "single", "grads/")
  assert max(float(np.max(np.abs(v))) for v in start.values()) > 1e-3
  assert len(set(np.round(runs["single/loss"], 4))) == STEPS


@pytest.mark.slow
def test_fsdp_shards_params_and_optimizer_state(runs):
  # Replicated (DP): every device holds everything.
  assert runs["dp8/param_fraction"] == pytest.approx(1.0)
  assert runs["dp8/opt_fraction"] == pytest.approx(1.0, abs=1e-3)
  # FSDP=8: ~1/8 per device (LayerNorm vectors and counters stay replicated).
  assert runs["fsdp8/param_fraction"] < 0.15, runs["fsdp8/param_fraction"]
  assert runs["fsdp8/opt_fraction"] < 0.15, runs["fsdp8/opt_fraction"]
  specs = json.loads(str(runs["fsdp8/specs"]))  # {path: [axes per dim]}
  assert specs["['bert']['layers'][0]['attention']['query']['kernel']"][0] \
      == "fsdp"
  assert specs["['bert']['embeddings']['word_embeddings']"][1] == "fsdp"


@pytest.mark.slow
def test_tensor_parallel_shards_heads_mlp_and_vocab(runs):
  specs = json.loads(str(runs["dp4_tp2/specs"]))
  layer = "['bert']['layers'][0]"
  # Megatron layout: heads/mlp split on the output of the first matmul and
  # the input of the second; the (tied) embedding split over the vocabulary.
  assert specs[f"{layer}['attention']['query']['kernel']"][1] == "tensor"
  assert specs[f"{layer}['attention']['output']['kernel']"][0] == "tensor"
  assert specs[f"{layer}['feed_forward']['intermediate']['kernel']"][1] == \
      "tensor"
  assert specs[f"{layer}['feed_forward']['output']['kernel']"][0] == "tensor"
  assert specs["['bert']['embeddings']['word_embeddings']"][0] == "tensor"
  # fsdp has size 1 here, so the tensor split halves the per-device state.
  assert 0.45 < runs["dp4_tp2/param_fraction"] < 0.6


@pytest.mark.slow
def test_grad_accumulation_matches_one_large_batch(runs):
  np.testing.assert_allclose(runs["fsdp8_accum2/loss"], runs["fsdp8/loss"],
                             rtol=0, atol=TOL)
  np.testing.assert_allclose(runs["fsdp8_accum2/grad_norm"],
                             runs["fsdp8/grad_norm"], rtol=TOL, atol=TOL)
  diff, where = _max_abs_diff(_prefixed(runs, "fsdp8_accum2", "params/"),
                              _prefixed(runs, "fsdp8", "params/"))
  assert diff <= TOL, f"accumulation: {where} differs by {diff:.2e}"


# ------------------------------------------------------------------------------
# Mesh config (no devices needed).
# ------------------------------------------------------------------------------
def _mesh_config(**kw):
  from bert_jax import config_lib
  c = config_lib.mesh_config()
  c.update(kw)
  return c


def test_mesh_shape_resolves_minus_one():
  from bert_jax.training import sharding
  assert sharding.mesh_shape(_mesh_config(data=-1), 8) == (8, 1, 1)
  assert sharding.mesh_shape(_mesh_config(data=1, fsdp=-1), 8) == (1, 8, 1)
  assert sharding.mesh_shape(_mesh_config(data=-1, tensor=2), 8) == (4, 1, 2)
  assert sharding.mesh_shape(_mesh_config(data=2, fsdp=2, tensor=2), 8) == (
      2, 2, 2)


def test_mesh_shape_with_slices():
  from bert_jax.training import sharding
  c = _mesh_config(data=1, fsdp=-1, dcn_data=2)
  assert sharding.mesh_shapes(c, 8) == ((1, 4, 1), (2, 1, 1))
  assert sharding.mesh_shape(c, 8) == (2, 4, 1)


@pytest.mark.parametrize("kw,match", [
    (dict(data=-1, fsdp=-1), "at most one"),
    (dict(data=3, fsdp=1, tensor=1), "data\\*fsdp\\*tensor = 3"),
    (dict(data=-1, tensor=3), "not divisible"),
    (dict(data=0), "mesh.data=0"),
    (dict(data=-1, dcn_data=3), "3 slices"),
])
def test_mesh_shape_errors_name_the_field(kw, match):
  from bert_jax.training import sharding
  with pytest.raises(ValueError, match=match):
    sharding.mesh_shape(_mesh_config(**kw), 8)


def test_validate_config_rejects_heads_not_divisible_by_tensor():
  from bert_jax.training import config_checks
  config = sharded_config(data=1, tensor=8)  # 4 heads over 8 tensor shards.
  with pytest.raises(ValueError, match="num_attention_heads=4 .*mesh.tensor=8"):
    config_checks.validate(config, 8)


def test_validate_config_rejects_batch_not_divisible_by_dp_times_accum():
  from bert_jax.training import config_checks
  config = sharded_config(data=8, accum=4)  # 16 rows over 8 replicas x 4 micro.
  with pytest.raises(ValueError, match="batch_size=16"):
    config_checks.validate(config, 8)


def test_tpu_compile_check_table_format():
  """The tool's table (the TPU compile itself needs libtpu, an optional
  install)."""
  tool = helpers.import_tool("tpu_compile_check")
  assert tool.mesh_overrides("fsdp") == dict(data=1, fsdp=-1, tensor=1)
  assert tool.mesh_overrides("tp4") == dict(data=-1, fsdp=1, tensor=4)
  assert tool.mesh_overrides("2.2.1") == dict(data=2, fsdp=2, tensor=1)
  assert tool.topology_options("v4:2x2x1") == dict(chip_config_name="megacore")
  assert tool.topology_options("v5e:2x2") == {}
  row = dict(zip(tool.MEMORY_COLUMNS, ["base", "v5e:2x2", "data=1 x fsdp=4 x "
                                "tensor=1", 512, "splash", 4, 316.9, 1260.6, 0.2514, 321.4,
                                2512.25, 317.0, 41.2]))
  table = tool.format_table([row, dict(row, config="large")]).splitlines()
  assert len(table) == 4 and table[0].startswith("| config")
  assert set(table[1]) <= set("|-:")
  assert "| base " in table[2] and "0.251" in table[2] and "2,512.2" in table[2]
  assert "| 512 " in table[2] and "| splash " in table[2]
  assert len({len(line) for line in table}) == 1  # Columns line up.


def test_tpu_compile_check_roofline_and_variants():
  """Roofline from XLA's counts (v5e: 197 TFLOP/s, 819 GB/s per chip), the
  --variants syntax, and full rows rendered with the cost columns."""
  tool = helpers.import_tool("tpu_compile_check")
  compute = tool.roofline("v5e:2x2", flops_per_chip=1.97e12,
                          bytes_per_chip=4.095e9, model_flops_per_chip=0.985e12)
  assert compute["roofline ms"] == pytest.approx(10.0)  # 1.97e12 / 197e12.
  assert compute["bound"] == "compute"
  assert compute["MFU bound"] == pytest.approx(0.5)
  memory = tool.roofline("v4:2x2x1", 2.75e12, 24.56e9, 2.75e12)
  assert memory["bound"] == "HBM"  # 20 ms of HBM vs 10 ms of compute.
  assert memory["roofline ms"] == pytest.approx(20.0)
  assert memory["MFU bound"] == pytest.approx(0.5)
  assert tool.parse_variants("128:xla:20,512:splash:80,256") == [
      (128, "xla", 20), (512, "splash", 80), (256, None, None)]
  with pytest.raises(ValueError, match="'x512' is not SEQ"):
    tool.parse_variants("x512")
  row = {c: 1.5 for c in tool.COLUMNS}
  row.update(config="base", topology="v5e:2x2", mesh="m", attention="xla",
             bound="HBM")
  table = tool.format_table([row]).splitlines()
  assert "MFU bound" in table[0] and "|   HBM |" in table[2]
  # A step that does not fit: libtpu's message (ModernBERT-base, 8,192
  # tokens, XLA attention, v5e) -> what it needs and what a chip has.
  message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory "
             "required for HLO temporaries (27.59G) exceeds available HBM "
             "(15.75G).")
  assert tool.out_of_memory(message) == pytest.approx((27.59 * 1024,
                                                       15.75 * 1024))
  assert tool.out_of_memory("INTERNAL: something else") is None
  assert tool.out_of_memory(message.replace("RESOURCE_EXHAUSTED", "X")) is None
  oom = {c: "-" for c in tool.COLUMNS}
  oom.update(row, **{"temporaries MB": 28252.2, "roofline ms": "-"},
             bound="OOM: 27.6 > 15.75 GiB")
  table = tool.format_table([row, oom]).splitlines()
  assert "OOM: 27.6 > 15.75 GiB" in table[3] and "28,252.2" in table[3]
  assert len({len(line) for line in table}) == 1


if __name__ == "__main__":
  if sys.argv[1] == "child":
    child_main(sys.argv[2])
  else:
    raise SystemExit(f"unknown mode {sys.argv[1:]}")
