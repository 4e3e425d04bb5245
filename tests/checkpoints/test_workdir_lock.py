"""One writer per workdir: the lock itself (local flock, ram:// identity)."""

import json
import os
import signal
import subprocess
import sys

import pytest

from bert_jax.checkpoints import workdir_lock
from bert_jax.checkpoints.workdir_lock import WorkdirInUseError
from bert_jax.checkpoints.workdir_lock import WorkdirLock
from tests.helpers import child_env

# A process that takes a local workdir and holds it until killed.
# (argv[2], when given, is the host the holder names: a run on another host
# of a shared NFS mount.)
_HOLDER = """
import sys, time
from bert_jax.checkpoints import workdir_lock
lock = workdir_lock.WorkdirLock(sys.argv[1])
lock.me["host"] = sys.argv[2] if len(sys.argv) > 2 else lock.me["host"]
lock.acquire()
print("HELD", flush=True)
time.sleep(600)
"""


def _start_holder(workdir, host=None):
  proc = subprocess.Popen(
      [sys.executable, "-c", _HOLDER, str(workdir), *([host] if host else [])],
      env=child_env(), stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "HELD"
  return proc


@pytest.mark.slow
def test_local_lock_refuses_second_writer_names_holder_and_dies_with_it(
    tmp_path):
  holder = _start_holder(tmp_path)
  try:
    with pytest.raises(WorkdirInUseError) as e:
      WorkdirLock(str(tmp_path)).acquire()
    msg = str(e.value)
    assert f"pid {holder.pid}" in msg and "host " in msg and "started " in msg
    assert len(msg.splitlines()) == 1
    # The identity the refusal names is the file's content.
    with open(tmp_path / workdir_lock.LOCK_NAME) as f:
      assert json.load(f)["pid"] == holder.pid
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # kill -9: the kernel dropped the flock; the next run takes it at once.
  lock = WorkdirLock(str(tmp_path)).acquire()
  with open(tmp_path / workdir_lock.LOCK_NAME) as f:
    assert json.load(f)["pid"] == os.getpid()
  lock.release()


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()
  return proc.pid


def _write_identity(path, **fields):
  """What another run's acquire() leaves there."""
  workdir_lock.write_identity(path, dict(workdir_lock.identity(), **fields))


def test_object_store_lock_on_ram_path(caplog):
  """gs://-style workdirs (ram:// stands in): identity object, checked
  before saves; dead holders on this host are taken over, other hosts need
  --take_over_workdir."""
  import tensorflow as tf
  workdir = f"ram://lock_test_{os.getpid()}/run"
  tf.io.gfile.makedirs(workdir)
  path = f"{workdir}/{workdir_lock.LOCK_NAME}"

  first = WorkdirLock(workdir).acquire()
  # A live holder on this host (this process) refuses a second run.
  with pytest.raises(WorkdirInUseError, match=f"pid {os.getpid()}"):
    WorkdirLock(workdir).acquire()
  first.verify()  # Still ours.

  # A holder on this host whose pid is dead: taken over with a warning.
  _write_identity(path, pid=_dead_pid(), run_id="dead")
  with caplog.at_level("WARNING"):
    second = WorkdirLock(workdir).acquire()
  assert "no longer alive" in caplog.text
  # The first run finds another identity before its next save and stops.
  with pytest.raises(WorkdirInUseError, match="took over"):
    first.verify()

  # A holder on another host cannot be checked: refused, unless told.
  _write_identity(path, host="other-host", pid=1, run_id="other")
  with pytest.raises(WorkdirInUseError, match="--take_over_workdir") as e:
    WorkdirLock(workdir).acquire()
  assert "host other-host" in str(e.value)
  third = WorkdirLock(workdir, take_over=True).acquire()
  with tf.io.gfile.GFile(path) as f:
    assert json.load(f)["run_id"] == third.me["run_id"]
  second.release()  # Not its identity any more: leaves it alone.
  assert tf.io.gfile.exists(path)
  third.release()  # Finished cleanly: the next run starts without a warning.
  assert not tf.io.gfile.exists(path)


def test_second_lock_in_one_process_is_refused_until_the_first_is_released(
    tmp_path):
  """flock belongs to an open file, not a process: a second WorkdirLock of
  the same workdir is refused here too, with one line naming the holder,
  and takes the workdir once the first is released."""
  first = WorkdirLock(str(tmp_path)).acquire()
  with pytest.raises(WorkdirInUseError) as e:
    WorkdirLock(str(tmp_path)).acquire()
  msg = str(e.value)
  assert len(msg.splitlines()) == 1
  assert f"in use by another run (host {first.me['host']}, pid {os.getpid()}" \
      in msg, msg
  assert "its lock is held, so that run is alive" in msg, msg
  first.verify()  # A local lock cannot be taken from under its holder.
  first.release()
  second = WorkdirLock(str(tmp_path)).acquire()
  with open(tmp_path / workdir_lock.LOCK_NAME) as f:
    assert json.load(f)["run_id"] == second.me["run_id"]
  second.release()


def test_workdir_that_is_a_file_is_one_sentence(tmp_path):
  f = tmp_path / "a_file"
  f.write_text("x")
  for bad in (f, f / "sub"):
    with pytest.raises(ValueError, match="is not a directory"):
      workdir_lock.prepare_workdir(str(bad))
  workdir_lock.prepare_workdir(str(tmp_path / "new" / "run"))
  assert (tmp_path / "new" / "run").is_dir()
  assert os.listdir(tmp_path / "new" / "run") == []  # The probe is gone.


@pytest.mark.slow
def test_take_over_never_writes_while_the_holder_keeps_its_lock(tmp_path):
  """--take_over_workdir on a local (NFS) workdir whose holder on another
  host still holds the flock: that run is alive, so the workdir is refused
  with one line naming it and the lock file keeps the holder's identity:
  never two writers on one workdir."""
  from tests.helpers import failure_lines
  from tests.helpers import in_process
  from tests.helpers import written_files
  workdir = tmp_path / "run"
  workdir.mkdir()
  holder = _start_holder(workdir, host="other-host")
  try:
    with open(workdir / workdir_lock.LOCK_NAME) as f:
      before = f.read()
    with pytest.raises(WorkdirInUseError) as e:
      WorkdirLock(str(workdir), take_over=True).acquire()
    msg = str(e.value)
    assert len(msg.splitlines()) == 1
    assert f"host other-host, pid {holder.pid}" in msg, msg
    assert "its lock is held, so that run is alive" in msg, msg
    # End to end: one line, exit 1, nothing of the holder's touched.
    (line,) = failure_lines(
        in_process.run_main(workdir, "--take_over_workdir",
                            "--config.train.num_steps=2"), max_lines=2)[-1:]
    assert line.startswith(f"error: Workdir {workdir} is in use by another "
                           f"run (host other-host, pid {holder.pid}"), line
    assert written_files(workdir) == []
    with open(workdir / workdir_lock.LOCK_NAME) as f:
      assert f.read() == before
    assert holder.poll() is None
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()


class _Refused(Exception):
  pass


def _fail_in(workdir, write=None):
  with pytest.raises(_Refused):
    with workdir_lock.hold(str(workdir)):
      assert (workdir / workdir_lock.LOCK_NAME).exists()
      if write:
        (workdir / write).write_text("x")
      raise _Refused()


def test_a_failed_run_removes_only_what_taking_the_workdir_created(tmp_path):
  # A fresh workdir two levels down: the lock and all three directories go.
  _fail_in(tmp_path / "a" / "b" / "run")
  assert os.listdir(tmp_path) == []
  # An existing workdir stays with its files; only the lock file goes.
  existing = tmp_path / "existing"
  existing.mkdir()
  (existing / "notes.txt").write_text("mine")
  _fail_in(existing)
  assert os.listdir(existing) == ["notes.txt"]
  # A finished run keeps its lock file; a failed run later leaves it too
  # (it did not make it).
  with workdir_lock.hold(str(existing)):
    pass
  assert sorted(os.listdir(existing)) == [workdir_lock.LOCK_NAME, "notes.txt"]
  _fail_in(existing)
  assert sorted(os.listdir(existing)) == [workdir_lock.LOCK_NAME, "notes.txt"]
  # A run that wrote before failing: its files and so its directory stay.
  wrote = tmp_path / "wrote"
  _fail_in(wrote, write="metrics.jsonl")
  assert os.listdir(wrote) == ["metrics.jsonl"]


def test_a_workdir_in_use_is_refused_without_touching_it(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  holder = _start_holder(workdir)
  try:
    with open(workdir / workdir_lock.LOCK_NAME) as f:
      before = f.read()
    with pytest.raises(WorkdirInUseError):
      with workdir_lock.hold(str(workdir)):
        pass
    with open(workdir / workdir_lock.LOCK_NAME) as f:
      assert f.read() == before
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
