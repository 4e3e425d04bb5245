"""tools/launch_tpu.sh (gcloud commands for a multi-host slice) and the
workdir check of tools/preflight.py. No gcloud and no TPU: --dry-run, a fake
`gcloud` on PATH, and 2 CPU processes stand in."""

import os
import shlex
import socket
import stat
import subprocess
import sys

import pytest

from tests import helpers

REPO = helpers.REPO
LAUNCH = os.path.join(REPO, "tools", "launch_tpu.sh")
TRAIN = ["python", "-m", "bert_jax.main", "--config", "configs/base.py",
         "--workdir", "gs://bucket/run 1", "--config.mesh.fsdp=-1"]


def _launch(args, env=None):
  return subprocess.run(["bash", LAUNCH] + args, capture_output=True,
                        text=True, env=env, timeout=60, check=True)


def _commands(stdout):
  return [shlex.split(line) for line in stdout.splitlines() if line]


def _remote(cmd):
  """The shell command an `ssh --worker=all` runs, as argv after the cd."""
  assert cmd[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  assert "--worker=all" in cmd
  remote = cmd[cmd.index("--command") + 1]
  prefix = "cd ~/bert_jax && "
  assert remote.startswith(prefix), remote
  return shlex.split(remote[len(prefix):])


@pytest.mark.slow
@pytest.mark.parametrize("accelerator,queued", [("v5litepod-16", True),
                                                ("v4-32", False)])
def test_dry_run_prints_every_gcloud_command(accelerator, queued):
  flags = ["--create", accelerator] + (["--queued"] if queued else [])
  out = _launch(["bert", "us-east5-a", "--project", "proj", *flags,
                 "--setup", "--delete", "--dry-run", "--", *TRAIN]).stdout
  cmds = _commands(out)
  assert all(c[0] == "gcloud" for c in cmds), out
  for c in cmds:
    assert c[c.index("--zone") + 1] == "us-east5-a"
    assert c[c.index("--project") + 1] == "proj"
  create, rest = cmds[0], cmds[1:]
  if queued:
    assert create[:6] == ["gcloud", "compute", "tpus", "queued-resources",
                          "create", "bert"]
    assert create[create.index("--node-id") + 1] == "bert"
    assert rest[0][:5] == ["gcloud", "compute", "tpus", "queued-resources",
                           "describe"]
    rest = rest[1:]
  else:
    assert create[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "create",
                          "bert"]
  assert create[create.index("--accelerator-type") + 1] == accelerator
  scp, install, preflight, train, delete = rest
  assert scp[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"]
  assert "--worker=all" in scp
  assert install[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
  assert "--worker=all" in install
  assert "pip install" in install[install.index("--command") + 1]
  assert _remote(preflight)[:2] == ["python", "tools/preflight.py"]
  assert _remote(preflight)[-2:] == ["--workdir", "gs://bucket/run 1"]
  # The identical training command, on every worker at once.
  assert _remote(train) == TRAIN
  kind = "queued-resources" if queued else "tpu-vm"
  assert delete[:6] == ["gcloud", "compute", "tpus", kind, "delete", "bert"]


@pytest.mark.slow
def test_dry_run_runs_nothing_and_real_run_runs_what_it_printed(tmp_path):
  """A fake gcloud logs its argv: the real run's calls equal the dry run."""
  log = tmp_path / "calls"
  fake = tmp_path / "gcloud"
  fake.write_text("#!/usr/bin/env python3\nimport shlex, sys\n"
                  f"open({str(log)!r}, 'a').write(shlex.join(sys.argv[1:]) "
                  "+ '\\n')\nprint('ACTIVE')\n")
  fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
  env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
  args = ["bert", "us-central2-b", "--create", "v4-32", "--queued",
          "--delete", "--", *TRAIN]
  printed = _launch(args[:-len(TRAIN) - 1] + ["--dry-run", "--", *TRAIN],
                    env=env).stdout
  assert not log.exists()
  _launch(args, env=env)
  ran = [["gcloud"] + shlex.split(l) for l in log.read_text().splitlines()]
  assert ran == _commands(printed)
  assert len(ran) == 5  # create, describe, preflight, train, delete.


@pytest.mark.slow
def test_launch_needs_a_command():
  proc = subprocess.run(["bash", LAUNCH, "bert", "zone", "--dry-run"],
                        capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2 and "no command after --" in proc.stderr


def _preflight_module():
  return helpers.import_tool("preflight")


def test_check_workdir():
  check = _preflight_module().check_workdir
  check("/tmp/run", 1)  # One host: any path.
  check("gs://bucket/run", 4)
  check(None, 4)  # No training workdir given: nothing to check.
  with pytest.raises(ValueError,
                     match="--workdir=/tmp/run is a local path.*gs://"):
    check("/tmp/run", 4)


@pytest.mark.slow
def test_preflight_refuses_local_workdir_on_two_processes(tmp_path):
  """Both processes stop with the sentence, before the all-reduce."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  env = dict(os.environ, JAX_PLATFORMS="cpu")

  def run(workdir):
    procs = [subprocess.Popen(
        [sys.executable, os.path.join(REPO, "tools", "preflight.py"),
         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
         f"--process_id={i}", "--timeout=120", f"--workdir={workdir}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)]
    return [(p.wait(timeout=180), p.stdout.read()) for p in procs]

  for rc, out in run(str(tmp_path / "run")):
    assert rc == 1, out
    assert "is a local path but this job has 2 processes" in out
    assert "preflight OK" not in out
