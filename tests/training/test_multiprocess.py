"""Multi-host training on one machine: 2 processes x 4 CPU devices.

Each process calls ``jax.distributed.initialize("127.0.0.1:PORT", 2, i)``,
feeds only its own rows of the global batch
(``jax.make_array_from_process_local_data``), trains a few steps on a
DP=2 x FSDP=2 x TP=2 mesh whose data axis spans the two processes (the
multi-slice/DCN layout, processes standing in for slices) and saves an Orbax
checkpoint together. The losses and the saved parameters must equal those of
one process driving all 8 devices.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers
from tests.helpers import BATCH
from tests.helpers import REPO
from tests.helpers import TINY_OVERRIDES
from tests.helpers import free_port

pytestmark = pytest.mark.slow

TOL = 1e-5
STEPS = 3


def tiny_config(**mesh):
  c = helpers.sharded_config(num_steps=STEPS, mesh=mesh)
  c.checkpoint.update(save_every_steps=STEPS, max_to_keep=1)
  return c


def synthetic_batch(step: int) -> dict:
  return helpers.synthetic_batch(2000 + step)


def local_rows(batch_sharding, global_batch_size: int) -> np.ndarray:
  """The rows of the global batch that this process's devices hold."""
  index_map = batch_sharding.addressable_devices_indices_map(
      (global_batch_size,))
  rows = set()
  for index in index_map.values():
    rows.update(range(*index[0].indices(global_batch_size)))
  return np.array(sorted(rows))


def worker(process_id: int, num_processes: int, port: int, workdir: str,
           out: str) -> None:
  import jax
  if num_processes > 1:
    jax.distributed.initialize(f"127.0.0.1:{port}",
                               num_processes=num_processes,
                               process_id=process_id)
  from bert_jax.checkpoints import manager
  from bert_jax.training import config_checks
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib

  assert jax.device_count() == 8 and jax.process_count() == num_processes
  if num_processes > 1:  # Data axis across the processes (DCN), 2x2 inside.
    config = tiny_config(data=1, fsdp=2, tensor=2, dcn_data=2)
  else:
    config = tiny_config(data=2, fsdp=2, tensor=2)
  config_checks.validate(config, jax.device_count(), jax.process_count(),
                         check_sources=False)
  mesh = sharding.make_mesh(config.mesh)
  programs = steps_lib.Programs(config, mesh)
  rows = local_rows(programs.batch_sharding, BATCH)
  assert len(rows) == BATCH // num_processes, rows
  checkpointer = manager.Checkpointer(workdir, config.checkpoint)
  losses = []
  with programs.context():
    state = programs.init()
    for step in range(STEPS):
      local = {k: v[rows] for k, v in synthetic_batch(step).items()}
      batch = sharding.global_batch(local, programs.batch_sharding)
      state, metrics = programs.train_step(state, batch)
      losses.append(float(metrics["loss"]))
  checkpointer.save(STEPS, state, meta=dict(losses=losses), force=True)
  checkpointer.wait()
  checkpointer.close()
  with open(f"{out}.{process_id}.json", "w") as f:
    json.dump(dict(losses=losses, rows=rows.tolist(),
                   mesh=sharding.describe(mesh),
                   devices=[d.id for d in mesh.devices.flat],
                   process_count=jax.process_count(),
                   local_devices=jax.local_device_count()), f)
  if num_processes > 1:
    jax.distributed.shutdown()


def _wait_all(procs, timeout: int) -> list[str]:
  """Output of each process; all must exit 0 (none is left running)."""
  logs = []
  try:
    for p in procs:
      logs.append(p.communicate(timeout=timeout)[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for i, p in enumerate(procs):
    assert p.returncode == 0, f"process {i} failed:\n{logs[i][-5000:]}"
  return logs


def _launch(num_processes: int, workdir: str, out: str, timeout=600):
  port = free_port()
  procs = [subprocess.Popen(
      [sys.executable, os.path.abspath(__file__), "worker", str(i),
       str(num_processes), str(port), workdir, out],
      env=helpers.child_env(8 // num_processes), cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(num_processes)]
  _wait_all(procs, timeout)
  results = []
  for i in range(num_processes):
    with open(f"{out}.{i}.json") as f:
      results.append(json.load(f))
  return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  base = tmp_path_factory.mktemp("multiprocess")
  return {n: (str(base / f"w{n}"),
              _launch(n, str(base / f"w{n}"), str(base / f"out{n}")))
          for n in (1, 2)}


def test_two_processes_see_eight_devices_and_split_the_batch(runs):
  _, results = runs[2]
  assert [r["process_count"] for r in results] == [2, 2]
  assert [r["local_devices"] for r in results] == [4, 4]
  assert results[0]["mesh"] == "data=2 x fsdp=2 x tensor=2"
  rows = [set(r["rows"]) for r in results]
  assert not rows[0] & rows[1] and len(rows[0] | rows[1]) == BATCH


def test_losses_equal_single_process(runs):
  single = runs[1][1][0]["losses"]
  assert len(single) == STEPS and np.all(np.isfinite(single))
  for r in runs[2][1]:  # Every process reports the same global loss.
    np.testing.assert_allclose(r["losses"], single, rtol=0, atol=TOL)


def test_checkpoint_written_together_equals_single_process(runs):
  import jax

  from bert_jax.checkpoints import reading as checkpoint_reading
  two, _, step_two = checkpoint_reading.load_params(runs[2][0])
  one, _, step_one = checkpoint_reading.load_params(runs[1][0])
  assert step_two == step_one == STEPS
  a, b = jax.tree.leaves(two), jax.tree.leaves(one)
  assert len(a) == len(b) > 10
  worst = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
              for x, y in zip(a, b))
  assert worst <= TOL, worst


def test_main_cli_trains_with_two_processes(tmp_path):
  """The user's command: `python -m bert_jax.main` with the coordinator
  flags, on 2 processes x 4 devices, real per-host input pipelines."""
  port, workdir = free_port(), str(tmp_path / "w")
  cmd = [sys.executable, "-m", "bert_jax.main", "--config",
         os.path.join(REPO, "configs", "tiny.py"), "--workdir", workdir,
         *TINY_OVERRIDES, "--config.train.num_steps=4",
         "--config.train.log_every=1", "--config.checkpoint.save_every_steps=2",
         "--config.mesh.data=2", "--config.mesh.fsdp=2",
         "--config.mesh.tensor=2", f"--coordinator_address=127.0.0.1:{port}",
         "--num_processes=2"]
  procs = [subprocess.Popen(cmd + [f"--process_id={i}"], env=helpers.child_env(4),
                            cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = _wait_all(procs, timeout=600)
  # Both report the same global eval (and unigram baseline) ...
  finals = [[l for l in log.splitlines() if "final held-out" in l]
            for log in logs]
  assert finals[0] and finals[0] == finals[1], finals
  for log in logs:
    assert "over 8 devices (2 processes)" in log, log[-3000:]
  # ... process 0 alone writes metrics, every step once; one checkpoint.
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4]
  assert all(np.isfinite(r["loss"]) for r in rows if r["split"] == "train")
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["2", "4"]


# Process 0's tokenizer training fails (a bad corpus, a full disk): the
# others waited up to an hour for the file it never wrote.
_FAILING_TOKENIZER_DRIVER = """
import jax
from bert_jax.data import tokenizers

def train(*args, **kwargs):
  if jax.process_index() == 0:
    raise ValueError("TOKENIZER-FAILED on process 0")
  raise AssertionError("only process 0 trains the tokenizer")

tokenizers.train = train
from bert_jax import cli, main
cli.run(main.main)
"""


def test_a_failed_tokenizer_on_process_0_stops_every_process(tmp_path):
  port, workdir = free_port(), str(tmp_path / "w")
  driver = tmp_path / "driver.py"
  driver.write_text(_FAILING_TOKENIZER_DRIVER)
  cmd = [sys.executable, str(driver), "--config",
         os.path.join(REPO, "configs", "tiny.py"), "--workdir", workdir,
         *TINY_OVERRIDES, "--config.train.num_steps=2",
         "--config.mesh.data=2", f"--coordinator_address=127.0.0.1:{port}",
         "--num_processes=2"]
  procs = [subprocess.Popen(cmd + [f"--process_id={i}"],
                            env=helpers.child_env(1), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True) for i in range(2)]
  try:  # Both stop with process 0's failure, not at a polling timeout.
    logs = [p.communicate(timeout=300)[0] for p in procs]
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  assert [p.returncode for p in procs] == [1, 1], logs
  last = [log.rstrip("\n").splitlines()[-1] for log in logs]
  assert last[0] == "error: TOKENIZER-FAILED on process 0", logs[0][-3000:]
  assert last[1].startswith("error: Process 0 could not train the "
                            "tokenizer "), logs[1][-3000:]
  assert "(its log says why)" in last[1]


if __name__ == "__main__":
  if sys.argv[1] == "worker":
    worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5],
           sys.argv[6])
  else:
    raise SystemExit(f"unknown mode {sys.argv[1:]}")
