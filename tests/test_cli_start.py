"""A new user's first commands: what they type and what they see.

One pretraining run as a user starts it (no JAX_PLATFORMS, no
TF_CPP_MIN_LOG_LEVEL in the environment, a ``file://`` workdir), then the
export of its checkpoint: the run works and neither prints library chatter
(TensorFlow's "failed call to cuInit" on a CPU start, Orbax's INFO lines
in an export); ``--verbose`` still shows everything. A ``file://`` URL
naming another host is one line.
"""

import logging
import os
import subprocess
import sys

import pytest

from tests import helpers
from tests.helpers import REPO
from tests.helpers import in_process


def _user_env(**extra):
  """What a user's shell has: none of the quieting the test suite sets."""
  env = helpers.child_env(**extra)
  for name in ("JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL", "XLA_FLAGS"):
    env.pop(name, None)
  return env


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("first") / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "bert_jax.main", "--config",
       os.path.join(REPO, "configs", "tiny.py"), "--workdir",
       f"file://{workdir}", *helpers.TINY_OVERRIDES,
       "--config.train.num_steps=2", "--config.train.log_every=1"],
      cwd=REPO, env=_user_env(), capture_output=True, text=True, timeout=600)
  return dict(workdir=workdir, proc=proc)


@pytest.mark.slow
def test_file_url_workdir_is_the_local_directory(first_run):
  proc, workdir = first_run["proc"], first_run["workdir"]
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert os.path.isdir(workdir / "checkpoints" / "2" / "state")
  assert f"Took workdir {workdir} " in proc.stderr
  assert not os.path.exists("file:")  # Not a relative directory named so.


def test_file_url_naming_another_host_is_one_line():
  proc = in_process.run_module(
      "main", "--config", os.path.join(REPO, "configs", "tiny.py"),
      "--workdir", "file://otherhost/tmp/run")
  (line,) = helpers.failure_lines(proc, max_lines=1)
  assert line.startswith("error: --workdir: file://otherhost/tmp/run names a "
                         "path on host 'otherhost'"), line


@pytest.mark.slow
def test_cpu_start_prints_no_cuda_or_backend_probe(first_run):
  err = first_run["proc"].stderr
  assert first_run["proc"].returncode == 0, err[-3000:]
  assert "cuInit" not in err and "CUDA error" not in err, err[:3000]
  assert "Unable to initialize backend" not in err, err[:3000]  # JAX's TPU.
  assert "Sharding callback duration" not in err  # TensorFlow's saver.
  assert "step 2/2" in err  # Our own lines are all there.


@pytest.mark.slow
def test_export_prints_only_what_it_wrote_unless_verbose(first_run, tmp_path):
  assert first_run["proc"].returncode == 0
  cmd = [sys.executable, "-m", "bert_jax.to_hf", str(first_run["workdir"])]
  quiet = subprocess.run(cmd + [str(tmp_path / "hf")], cwd=REPO,
                         env=_user_env(), capture_output=True, text=True,
                         timeout=300)
  assert quiet.returncode == 0, quiet.stderr[-3000:]
  assert quiet.stdout.startswith(f"Wrote {tmp_path / 'hf'}: config.json")
  assert [ln for ln in quiet.stderr.splitlines() if ln.strip()] == [], (
      quiet.stderr)
  verbose = subprocess.run(cmd + [str(tmp_path / "hf2"), "--verbose"],
                           cwd=REPO, env=_user_env(), capture_output=True,
                           text=True, timeout=300)
  assert verbose.returncode == 0, verbose.stderr[-3000:]
  assert "INFO Restoring checkpoint from" in verbose.stderr


@pytest.mark.slow
def test_verbose_keeps_every_library_line(monkeypatch):
  """--verbose: TensorFlow's C++ log level is left alone and the libraries'
  INFO records pass the filter."""
  code = ("import os, sys; sys.argv[1:] = {argv!r}; from bert_jax import cli;"
          "print(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))")
  levels = [subprocess.run(
      [sys.executable, "-c", code.format(argv=argv)], cwd=REPO,
      env=_user_env(), capture_output=True, text=True,
      timeout=120).stdout.split()[-1] for argv in ([], ["--verbose"])]
  assert levels[0] == "3" and levels[1] != "3", levels

  import orbax.checkpoint
  import tensorflow

  from bert_jax import cli
  orbax, tf_info, ours = (
      logging.LogRecord("absl", logging.INFO, path, 1, "message", (), None)
      for path in (orbax.checkpoint.__file__, tensorflow.__file__,
                   "/home/me/jax/bert_jax/training/x.py"))
  for verbose in (False, True):
    monkeypatch.setattr(cli, "_verbose", lambda argv=None, v=verbose: v)
    assert cli._QuietLibraries().filter(orbax) is verbose
    assert cli._QuietLibraries().filter(tf_info) is verbose
    assert cli._QuietLibraries().filter(ours)  # Ours, wherever it lives.
