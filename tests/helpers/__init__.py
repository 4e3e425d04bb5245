"""Test helpers: one tiny config, one synthetic batch, one child environment.

Imported by the tests and by the child processes some of them start (which run
test files as scripts with the repo on PYTHONPATH), so it imports nothing from
pytest and nothing heavy at module level.
"""

from __future__ import annotations

import importlib.util
import json
import logging as std_logging
import os
import re
import signal
import socket
import subprocess
import sys
import time

import ml_collections
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Flags that shrink configs/tiny.py to a seconds-scale run on 2 CPU cores.
TINY_OVERRIDES = (
    "--config.model.vocab_size=512",
    "--config.model.hidden_size=64",
    "--config.model.num_attention_heads=4",
    "--config.model.intermediate_size=256",
    "--config.model.max_position_embeddings=64",
    "--config.data.tokenizer_vocab_size=512",
    "--config.data.seq_length=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.data.num_eval_batches=2",
    "--config.train.batch_size=16",
    "--config.train.learning_rate=2e-3",
    "--config.train.warmup_steps=5",
    # A fixed MFU peak skips the startup matmul probe (seconds per run).
    "--config.train.peak_tflops=1.0",
)

# The multi-device tests: runs on different meshes must agree, so no dropout.
BATCH, SEQ, PREDS, VOCAB = 16, 32, 5, 256
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def tiny_config(**groups: dict) -> ml_collections.ConfigDict:
  """configs/tiny.py with TINY_OVERRIDES applied, then per-group overrides.

  E.g. ``tiny_config(model=dict(vocab_size=256), mesh=dict(data=8))``: the
  same shrunken config `run_main` trains, with a test's own numbers on top.
  """
  from bert_jax import config_lib  # pylint: disable=g-import-not-at-top
  config = config_lib.get_config("tiny")
  for flag in TINY_OVERRIDES:
    key, value = flag[len("--config."):].split("=")
    group, field = key.split(".")
    config[group][field] = type(config[group][field])(value)
  for group, fields in groups.items():
    config[group].update(fields)
  return config


def sharded_config(data=1, fsdp=1, tensor=1, accum=1, num_steps=10,
                   **groups: dict) -> ml_collections.ConfigDict:
  """`tiny_config` as the multi-device tests use it (vocab 256, no dropout,
  lr 1e-3, one warm-up step) on a data x fsdp x tensor mesh."""
  groups = {k: dict(v) for k, v in groups.items()}
  model = dict(vocab_size=VOCAB, **NO_DROPOUT)
  model.update(groups.pop("model", {}))
  train = dict(batch_size=BATCH, num_steps=num_steps, warmup_steps=1,
               learning_rate=1e-3, grad_accum_steps=accum)
  train.update(groups.pop("train", {}))
  mesh = dict(data=data, fsdp=fsdp, tensor=tensor)
  mesh.update(groups.pop("mesh", {}))
  return tiny_config(model=model, train=train, mesh=mesh, **groups)


def synthetic_batch(seed: int, batch: int = BATCH, seq: int = SEQ,
                    preds: int = PREDS, vocab: int = VOCAB,
                    two_segments: bool = True,
                    fully_padded_rows=()) -> dict[str, np.ndarray]:
  """A deterministic pretraining batch (features.PRETRAINING shapes/dtypes):
  varied lengths with trailing padding, masked weights ~70% ones."""
  from bert_jax.data import features  # pylint: disable=g-import-not-at-top
  r = np.random.RandomState(seed)
  lengths = r.randint(seq // 2, seq + 1, size=batch)
  lengths[list(fully_padded_rows)] = 0
  mask = np.arange(seq)[None] < lengths[:, None]
  segments = (np.arange(seq)[None] >= lengths[:, None] // 2) * mask
  values = dict(
      input_ids=r.randint(5, vocab, (batch, seq)) * mask,
      input_mask=mask,
      segment_ids=segments if two_segments else np.zeros((batch, seq)),
      masked_lm_positions=r.randint(1, seq // 2, (batch, preds)),
      masked_lm_ids=r.randint(5, vocab, (batch, preds)),
      masked_lm_weights=r.rand(batch, preds) > 0.3,
      next_sentence_labels=r.randint(0, 2, (batch,)))
  shapes = features.batch_shapes(features.PRETRAINING, batch, seq, preds)
  assert set(shapes) == set(values), sorted(set(shapes) ^ set(values))
  return {k: values[k].astype(dtype).reshape(shape)
          for k, (shape, dtype) in shapes.items()}


def noised_params(module, seed: int = 0) -> dict:
  """`module`'s params plus N(0, 0.05) noise, as a pure dict: zero-initialized
  biases and unit layer-norm scales become values a wrong formula shows."""
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  r = np.random.RandomState(seed)
  return jax.tree.map(
      lambda x: np.asarray(x) + r.normal(0, 0.05, x.shape).astype(np.float32),
      nnx.state(module, nnx.Param).to_pure_dict())


def free_port() -> int:
  """A TCP port nobody listens on now (for jax.distributed coordinators)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def child_env(devices: int | None = None, **extra) -> dict:
  """Environment for a `python` child: this repo importable, CPU only, quiet
  TF, no hub downloads; `devices` fake CPU devices (fast XLA compiles, the
  steps are tiny); `extra` on top."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
             HF_HUB_OFFLINE="1",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  if devices is not None:
    env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={devices} "
                        "--xla_backend_optimization_level=0")
  env.update(extra)
  return env


def tiny_main_args(workdir, *flags) -> list[str]:
  """`bert_jax.main`'s arguments for the tiny config in `workdir`."""
  return ["--config", os.path.join(REPO, "configs", "tiny.py"), "--workdir",
          str(workdir), *TINY_OVERRIDES, *flags]


def run_main(workdir, *flags, env=None, timeout=600):
  """Run `python -m bert_jax.main` with the tiny config; returns the result."""
  cmd = [sys.executable, "-m", "bert_jax.main",
         *tiny_main_args(workdir, *flags)]
  return subprocess.run(cmd, cwd=REPO, env=child_env(**(env or {})),
                        capture_output=True, text=True, timeout=timeout)


def run_module(name, *args, timeout=600):
  """Run `python -m bert_jax.<name> *args` from the repo root."""
  return subprocess.run(
      [sys.executable, "-m", f"bert_jax.{name}", *args], cwd=REPO,
      env=child_env(), capture_output=True, text=True, timeout=timeout)


def run_tool(script, *args, timeout=600):
  """Run `python tools/<script> *args` from the repo root; returns the result."""
  return subprocess.run(
      [sys.executable, os.path.join(REPO, "tools", script), *args], cwd=REPO,
      env=child_env(), capture_output=True, text=True, timeout=timeout)


def config_module(name: str):
  """configs/<name>.py as a module, loaded by path as --config does
  (configs/ is a folder of files, not a package)."""
  spec = importlib.util.spec_from_file_location(
      f"configs_{name}", os.path.join(REPO, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(name: str) -> ml_collections.ConfigDict:
  """configs/<name>.py's get_config()."""
  return config_module(name).get_config()


def import_tool(name: str):
  """tools/<name>.py as a module (tools/ is scripts, not a package)."""
  module = sys.modules.get(f"tools.{name}")
  if module is None:
    spec = importlib.util.spec_from_file_location(
        f"tools.{name}", os.path.join(REPO, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
  return module


def unparse_flags() -> None:
  """absl's flags as before an entry point's command line was parsed in this
  process: values unparsed, and the --config.* override flags ml_collections
  defined for that line removed (the next parse defines them again).

  absl's logger keeps the level it had: unparsing resets the --verbosity
  flag, whose setter sets that logger to WARNING, and a later in-process
  test that reads INFO records (caplog) would see none.
  """
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  absl_logger = std_logging.getLogger("absl")
  level = absl_logger.level
  cli.FLAGS.unparse_flags()
  absl_logger.setLevel(level)
  for name in [n for n in cli.FLAGS if n.startswith("config.")]:
    delattr(cli.FLAGS, name)


# Lines of TF / XLA start-up chatter that are not ours.
NOT_OURS = re.compile(r"^(WARNING: All log messages|I0000|E0000|W0000)")


def failure_lines(result, max_lines: int = 3) -> list[str]:
  """The lines a user reads of a failed command: asserts a non-zero exit, no
  traceback and at most `max_lines` lines of its own on stderr."""
  assert result.returncode != 0, (result.stdout[-2000:], result.stderr[-2000:])
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  lines = [ln for ln in result.stderr.splitlines()
           if ln.strip() and not NOT_OURS.match(ln)]
  assert 0 < len(lines) <= max_lines, lines
  return lines


def written_files(workdir) -> list[str]:
  """Files a run left in `workdir`, less its lock (which outlives a run)."""
  return sorted(os.path.relpath(os.path.join(root, f), workdir)
                for root, _, files in os.walk(workdir) for f in files
                if f != ".workdir_lock.json")


def assert_train_iterator_resumes_exactly(config, tok, tmp_dir, *,
                                          saved_after: int, compared: int):
  """The pretraining iterator of `config` saved after `saved_after`
  batches, restored into a fresh one that has already moved on a batch
  (restoring rewinds it), gives the same next `compared` batches, every
  feature of the config's spec. Returns the restored iterator."""
  from bert_jax.data import features  # pylint: disable=g-import-not-at-top
  from bert_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  ckpt = os.path.join(tmp_dir, "ckpt")
  it = pipeline.create_train_iterator(config, tok, str(tmp_dir))
  for _ in range(saved_after):
    next(it)
  it.save(ckpt)
  want = [next(it) for _ in range(compared)]
  again = pipeline.create_train_iterator(config, tok, str(tmp_dir))
  next(again)
  again.restore(ckpt)
  for w, g in zip(want, [next(again) for _ in range(compared)]):
    for k in features.pretraining_spec(config.data):
      np.testing.assert_array_equal(w[k], g[k])
  return again


# -----------------------------------------------------------------------------
# Watching a `python -m bert_jax.main` child that writes WORKDIR.log.
# -----------------------------------------------------------------------------
def run_log(workdir) -> str:
  """What a child started with stdout/stderr to WORKDIR.log printed."""
  with open(f"{workdir}.log") as f:
    return f.read()


# `python -m bert_jax.main` that SIGKILLs itself once the checkpoint of step
# $KILL_AFTER is committed: a kill right after a chosen save, which a signal
# sent from outside cannot time.
_KILL_AFTER_SAVE = """
import os, signal
from bert_jax.checkpoints import manager
KILL_AFTER = int(os.environ["KILL_AFTER"])
_save = manager.Checkpointer.save

def save(self, step, *args, **kwargs):
  out = _save(self, step, *args, **kwargs)
  if step == KILL_AFTER:
    self.wait()
    os.kill(os.getpid(), signal.SIGKILL)
  return out

manager.Checkpointer.save = save
from absl import app
from bert_jax import main
app.run(main.main)
"""


def start_logged(workdir, module: str, *args,
                 env: dict | None = None) -> subprocess.Popen:
  """`python -m bert_jax.<module> *args` started in a child (`env`,
  `child_env()` if None), its output appended to WORKDIR.log."""
  with open(f"{workdir}.log", "a") as log:
    return subprocess.Popen(
        [sys.executable, "-m", f"bert_jax.{module}", *args], cwd=REPO,
        env=child_env() if env is None else env, stdout=log,
        stderr=subprocess.STDOUT, text=True)


def _run_here_logged(workdir, module: str, *args) -> int:
  """`python -m bert_jax.<module> *args` in this process, its output
  appended to WORKDIR.log as a child's; its exit status."""
  from tests.helpers import in_process  # pylint: disable=g-import-not-at-top
  result = in_process.run_module(module, *args)
  with open(f"{workdir}.log", "a") as log:
    log.write(result.stdout + result.stderr)
  return result.returncode


def run_main_logged(workdir, config: str, *flags, env: dict | None = None,
                    kill_after: int | None = None, timeout=600,
                    here: bool = False) -> int:
  """`python -m bert_jax.main --config configs/<config> --workdir WORKDIR
  *flags` to its end, the output appended to WORKDIR.log (`run_log`), so
  that a killed run and its rerun read as one log. Returns the exit code
  (-SIGKILL when killed).

  A child runs with `env` (`child_env()` if None). With `kill_after`, it
  SIGKILLs itself right after the checkpoint of that step is committed.
  With `here`, the run is never killed and runs in this process
  (`in_process`) without a child's start-up: it has this process's
  environment and devices, which are `child_env()`'s, so `env` must stay
  None."""
  args = ["--config", os.path.join(REPO, "configs", config), "--workdir",
          workdir, *flags]
  if here:
    assert env is None and kill_after is None, (env, kill_after)
    return _run_here_logged(workdir, "main", *args)
  head = [sys.executable, "-m", "bert_jax.main"]
  env = child_env() if env is None else env
  if kill_after is not None:
    driver = os.path.join(os.path.dirname(workdir), "kill_driver.py")
    with open(driver, "w") as f:
      f.write(_KILL_AFTER_SAVE)
    head = [sys.executable, driver]
    env = dict(env, KILL_AFTER=str(kill_after))
  with open(f"{workdir}.log", "a") as log:
    return subprocess.run(
        [*head, *args], cwd=REPO, env=env, stdout=log,
        stderr=subprocess.STDOUT, timeout=timeout).returncode


def train_records(workdir) -> list[dict]:
  """The train rows of WORKDIR/metrics.jsonl so far (a line being written
  is skipped)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  out = []
  with open(path) as f:
    for line in f.read().splitlines():
      try:
        out.append(json.loads(line))
      except ValueError:
        pass
  return [r for r in out if r["split"] == "train"]


def wait_for_step(proc, workdir, step, skip=0, timeout=600):
  """Poll metrics.jsonl (after `skip` train rows) until `step` is logged;
  fails the test if the child exits first."""
  import pytest  # pylint: disable=g-import-not-at-top  (children never call this)
  deadline = time.time() + timeout
  while time.time() < deadline:
    records = train_records(workdir)[skip:]
    if records and records[-1]["step"] >= step:
      return records[-1]["step"]
    if proc.poll() is not None:
      pytest.fail(f"run exited ({proc.returncode}) before step {step}:\n"
                  + run_log(workdir)[-3000:])
    time.sleep(0.02)
  pytest.fail(f"step {step} not reached in {timeout}s")


def assert_resumes_exactly_after_kill9(module: str, args, workdir, *,
                                       kill_after: int, save_every: int,
                                       num_steps: int):
  """`python -m bert_jax.<module> *args` (a run of `num_steps` steps that
  logs each and saves a checkpoint every `save_every`, synchronously) in a
  child (`child_env()`) killed with SIGKILL once step `kill_after` is
  logged, then the same command again, in this process (nobody kills it):
  the rerun resumes from the last checkpoint before the kill, runs to the
  end, and the steps it redoes have the killed run's losses bit for bit.
  Both runs' output goes to WORKDIR.log. Returns the rerun's train
  rows."""
  saved = kill_after // save_every * save_every
  proc = start_logged(workdir, module, *args)
  wait_for_step(proc, workdir, kill_after)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(timeout=60) == -signal.SIGKILL
  killed = {r["step"]: r for r in train_records(workdir)}
  assert max(killed) < saved + save_every, "killed too late to test resume"
  assert _run_here_logged(workdir, module, *args) == 0, (
      run_log(workdir)[-3000:])
  assert f"Resumed from checkpoint step {saved}" in run_log(workdir)
  resumed = train_records(workdir)[len(killed):]
  assert [r["step"] for r in resumed] == list(range(saved + 1, num_steps + 1))
  redone = [r for r in resumed if r["step"] in killed]
  assert len(redone) >= kill_after - saved
  for r in redone:  # Same rows, same losses.
    assert r["loss"] == killed[r["step"]]["loss"], r["step"]
  return resumed
