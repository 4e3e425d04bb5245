"""End to end: `python -m bert_jax.main` killed, preempted, fed a NaN.

One uninterrupted reference run, in this process; then the same command in
child processes, killed with SIGKILL at a step the test picks, rerun and
sent SIGTERM, and rerun to the end: every per-step loss must equal the
reference's exactly (CPU, same config, same device count, same XLA flags).
All runs share a persistent compilation cache, so only the first one
compiles.
"""

import math
import os
import re
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers
from tests.helpers import REPO
from tests.helpers import TINY_OVERRIDES
from tests.helpers import child_env
from tests.helpers import in_process

pytestmark = pytest.mark.slow

NUM_STEPS = 100
SAVE_EVERY = 10
KILL_AT = 25  # SIGKILL once this step is logged (the run is a little further).
FLAGS = (*TINY_OVERRIDES,
         f"--config.train.num_steps={NUM_STEPS}",
         "--config.train.log_every=1",
         "--config.train.eval_every=100000",
         f"--config.checkpoint.save_every_steps={SAVE_EVERY}",
         "--config.checkpoint.max_to_keep=3",
         "--config.train.peak_tflops=1.0")  # Skip the startup matmul benchmark.

# The trainer with a poisoned input: masked_lm_weights are NaN in the batches
# of the steps listed in NAN_AT (1-based), so loss and gradients are NaN.
_NAN_DRIVER = """
import os, sys
import numpy as np
from bert_jax.data import pipeline
NAN_AT = {int(s) for s in os.environ["NAN_AT"].split(",")}
_create = pipeline.create_train_iterator

class Poisoned:
  def __init__(self, it):
    self.it, self.n = it, 0
  def __iter__(self):
    return self
  def __next__(self):
    batch = next(self.it)
    self.n += 1
    if self.n in NAN_AT:
      w = batch["masked_lm_weights"]
      batch = dict(batch, masked_lm_weights=np.full_like(w, np.nan))
    return batch
  def save(self, d):
    return self.it.save(d)
  def restore(self, d):
    return self.it.restore(d)

pipeline.create_train_iterator = lambda *a, **k: Poisoned(_create(*a, **k))
from absl import app
from bert_jax import main
app.run(main.main)
"""


# ------------------------------------------------------------------------------
# Running the trainer.
# ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def env():
  e = child_env()  # The suite's compilation cache: runs alike compile once.
  e.pop("XLA_FLAGS", None)  # One device, like the reference.
  return e


def _args(workdir, *extra):
  return ["--config", os.path.join(REPO, "configs", "tiny.py"), "--workdir",
          str(workdir), *FLAGS, *extra]


def _cmd(workdir, *extra, driver=None):
  head = ([sys.executable, str(driver)] if driver else
          [sys.executable, "-m", "bert_jax.main"])
  return [*head, *_args(workdir, *extra)]


def _start(workdir, env, *extra, driver=None, extra_env=None):
  log = open(f"{workdir}.log", "a")
  return subprocess.Popen(_cmd(workdir, *extra, driver=driver), cwd=REPO,
                          env=dict(env, **(extra_env or {})), stdout=log,
                          stderr=subprocess.STDOUT, text=True)


def _finish(proc, timeout=600):
  proc.wait(timeout=timeout)
  proc.stdout.close() if proc.stdout else None
  return proc.returncode


def _losses(records) -> dict[int, float]:
  """step -> loss; a step logged twice (redone after a resume) keeps the last."""
  return {r["step"]: r["loss"] for r in records}


def _seed_workdir(reference, workdir):
  """Reuse the reference's tokenizer and corpus copy: same files, no retrain."""
  os.makedirs(workdir)
  for name in os.listdir(reference):
    if name.startswith(("tokenizer", "demo_corpus")):
      shutil.copytree(os.path.join(reference, name),
                      os.path.join(workdir, name))


def _checkpoint_steps(workdir) -> list[int]:
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit())


def _resumed_from(log: str) -> list[int]:
  return [int(s) for s in re.findall(r"Resumed from checkpoint step (\d+)", log)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run, in this process (same device count and XLA
  flags as the children, so the same losses bit for bit)."""
  workdir = str(tmp_path_factory.mktemp("reference") / "run")
  os.makedirs(workdir)
  result = in_process.run_module("main", *_args(workdir))
  assert result.returncode == 0, result.stderr[-3000:]
  losses = _losses(helpers.train_records(workdir))
  assert sorted(losses) == list(range(1, NUM_STEPS + 1))
  assert all(math.isfinite(v) for v in losses.values())
  return workdir, losses


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, env, reference):
  """Same command: SIGKILL near KILL_AT, rerun + SIGTERM, rerun to the end."""
  ref_dir, _ = reference
  workdir = str(tmp_path_factory.mktemp("interrupted") / "run")
  _seed_workdir(ref_dir, workdir)
  out = {"workdir": workdir}

  # 1. kill -9 at an arbitrary step.
  proc = _start(workdir, env)
  helpers.wait_for_step(proc, workdir, KILL_AT)
  proc.send_signal(signal.SIGKILL)
  out["kill_rc"] = _finish(proc)
  out["killed_records"] = helpers.train_records(workdir)
  out["killed_at"] = out["killed_records"][-1]["step"]
  out["log1"] = helpers.run_log(workdir)

  # 2. The same command again; SIGTERM (preemption notice) some steps later.
  n = len(out["killed_records"])
  proc = _start(workdir, env)
  first = helpers.wait_for_step(proc, workdir, 1, skip=n)
  helpers.wait_for_step(proc, workdir, first + 9, skip=n)
  proc.send_signal(signal.SIGTERM)
  out["term_rc"] = _finish(proc)
  out["term_records"] = helpers.train_records(workdir)[n:]
  log = helpers.run_log(workdir)
  out["log2"] = log[len(out["log1"]):]
  out["term_steps"] = _checkpoint_steps(workdir)

  # 3. And again, to the end.
  m = len(helpers.train_records(workdir))
  out["final_rc"] = _finish(_start(workdir, env))
  out["final_records"] = helpers.train_records(workdir)[m:]
  out["log3"] = helpers.run_log(workdir)[len(log):]
  return out


# ------------------------------------------------------------------------------
# Tests.
# ------------------------------------------------------------------------------
def test_kill9_then_same_command_resumes_exactly(reference, interrupted):
  _, ref = reference
  r = interrupted
  assert r["kill_rc"] == -signal.SIGKILL
  killed_at = r["killed_at"]
  assert KILL_AT <= killed_at < NUM_STEPS, "killed too late to test resume"
  # The rerun resumed from the last committed checkpoint before the kill...
  (resumed,) = _resumed_from(r["log2"])
  assert resumed % SAVE_EVERY == 0 and resumed <= killed_at
  assert r["term_records"][0]["step"] == resumed + 1
  # ...and redid the lost steps with exactly the uninterrupted losses.
  for rec in r["killed_records"] + r["term_records"] + r["final_records"]:
    assert rec["loss"] == ref[rec["step"]], rec
  assert _losses(r["killed_records"] + r["term_records"] +
                 r["final_records"]) == ref


def test_sigterm_commits_a_checkpoint_exits_0_and_resumes(reference,
                                                          interrupted):
  _, ref = reference
  r = interrupted
  assert r["term_rc"] == 0, r["log2"][-3000:]
  (preempted,) = [int(s) for s in re.findall(
      r"Preempted: checkpoint of step (\d+) committed", r["log2"])]
  # It finished the step it was on, saved exactly that step, and stopped.
  assert r["term_records"][-1]["step"] == preempted < NUM_STEPS
  assert preempted in r["term_steps"] and max(r["term_steps"]) == preempted
  assert "preempted at step" in r["log2"]
  # The next run continues from there, still on the reference trajectory.
  assert r["final_rc"] == 0, r["log3"][-3000:]
  assert _resumed_from(r["log3"]) == [preempted]
  assert r["final_records"][0]["step"] == preempted + 1
  assert all(rec["loss"] == ref[rec["step"]] for rec in r["final_records"])
  assert r["final_records"][-1]["step"] == NUM_STEPS


def test_nan_steps_are_skipped_then_stop_after_k_in_a_row(tmp_path, env,
                                                          reference):
  ref_dir, _ = reference
  workdir = str(tmp_path / "run")
  _seed_workdir(ref_dir, workdir)
  driver = tmp_path / "nan_driver.py"
  driver.write_text(_NAN_DRIVER)
  proc = _start(workdir, env, "--config.train.nonfinite_policy=skip",
                "--config.train.max_nonfinite_in_a_row=3", driver=driver,
                extra_env={"NAN_AT": "7,22,23,24"})
  rc = _finish(proc)
  log = helpers.run_log(workdir)
  assert rc == 1, log[-3000:]
  assert "3 non-finite steps in a row (steps 22-24" in log, log[-3000:]
  losses = _losses(helpers.train_records(workdir))
  # Step 7's update was dropped: training went on with finite losses.
  assert math.isnan(losses[7])
  assert all(math.isfinite(losses[s]) for s in range(8, 22))
  assert max(losses) <= 24  # Nothing trained after the third NaN in a row.
  # Checkpoints before the stop only, all finite; none after the NaN run.
  from bert_jax.checkpoints import checks as checkpoint_checks
  from bert_jax.checkpoints import reading as checkpoint_reading
  assert _checkpoint_steps(workdir) == [10, 20]
  params, _, _ = checkpoint_reading.load_params(workdir, 20)
  assert all(np.isfinite(v).all()
             for v in checkpoint_checks._flat(params).values())
