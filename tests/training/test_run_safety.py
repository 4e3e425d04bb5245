"""End to end: a run its own user cannot damage.

`python -m bert_jax.main` children on one workdir: a second run is refused
while the first trains (nothing of the first touched), Ctrl-C saves like
SIGTERM, kill -9 leaves nothing that blocks the next run; a full disk stops
the run at the next step with one line; bad inputs are one sentence (one
in a child, the others in process).
"""

import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests import helpers
from tests.helpers import REPO
from tests.helpers import TINY_OVERRIDES
from tests.helpers import child_env
from tests.helpers import in_process

SAVE_EVERY = 10
FLAGS = ("--config.train.log_every=1", "--config.train.eval_every=100000",
         f"--config.checkpoint.save_every_steps={SAVE_EVERY}",
         # A small iterator state: the test's file-size limit hits the async
         # array write, not the synchronous iterator save.
         "--config.data.shuffle_buffer=0")
# Lines of TF / XLA start-up chatter that are not ours.
_NOT_OURS = re.compile(r"^(WARNING: All log messages|I0000|E0000|W0000)")


def _cmd(workdir, *extra):
  return [sys.executable, "-m", "bert_jax.main", "--config",
          os.path.join(REPO, "configs", "tiny.py"), "--workdir", str(workdir),
          *TINY_OVERRIDES, *FLAGS, *extra]


def _start(workdir, *extra, **kwargs):
  log = open(f"{workdir}.log", "a")
  return subprocess.Popen(_cmd(workdir, *extra), cwd=REPO, env=child_env(),
                          stdout=log, stderr=subprocess.STDOUT, text=True,
                          **kwargs)


def _steps(workdir) -> list[int]:
  d = os.path.join(workdir, "checkpoints")
  return sorted(int(n) for n in os.listdir(d) if n.isdigit())


def _ours(text: str) -> list[str]:
  return [ln for ln in text.splitlines() if ln and not _NOT_OURS.match(ln)]


# ------------------------------------------------------------------------------
# One writer per workdir; Ctrl-C; kill -9 then take over.
# ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
  """A trains; B (same command) starts meanwhile; A gets Ctrl-C; C trains and
  is killed with -9; D (same command) takes the workdir over and resumes."""
  workdir = str(tmp_path_factory.mktemp("lock") / "run")
  out = {"workdir": workdir}
  a = _start(workdir, "--config.train.num_steps=100000")
  helpers.wait_for_step(a, workdir, SAVE_EVERY + 2)
  records_before = helpers.train_records(workdir)
  b = subprocess.run(_cmd(workdir, "--config.train.num_steps=100000"),
                     cwd=REPO, env=child_env(), capture_output=True, text=True,
                     timeout=600)
  out.update(a_pid=a.pid, b_rc=b.returncode, b_stderr=b.stderr,
             a_alive_after_b=a.poll() is None,
             records_before_b=records_before,
             records_after_b=helpers.train_records(workdir))
  a.send_signal(signal.SIGINT)  # Ctrl-C.
  out["a_rc"] = a.wait(timeout=600)
  out["a_log"] = helpers.run_log(workdir)
  out["a_records"] = helpers.train_records(workdir)
  out["a_steps"] = _steps(workdir)

  n = len(out["a_records"])
  c = _start(workdir, "--config.train.num_steps=100000")
  helpers.wait_for_step(c, workdir, out["a_records"][-1]["step"] + 1, skip=n)
  deadline = time.time() + 600
  while max(_steps(workdir)) <= max(out["a_steps"]):  # C committed one.
    assert time.time() < deadline and c.poll() is None, helpers.run_log(workdir)[-3000:]
    time.sleep(0.05)
  killed_at = helpers.train_records(workdir)[-1]["step"]
  c.send_signal(signal.SIGKILL)
  c.wait(timeout=60)
  out["c_steps"] = _steps(workdir)
  m = len(helpers.train_records(workdir))
  log_before_d = len(helpers.run_log(workdir))
  d = _start(workdir, f"--config.train.num_steps={killed_at + 3}")
  out["d_rc"] = d.wait(timeout=600)
  out["d_log"] = helpers.run_log(workdir)[log_before_d:]
  out["d_records"] = helpers.train_records(workdir)[m:]

  # E: D's newest checkpoint truncated (a disk that lost a file's tail).
  out["e_steps"] = _steps(workdir)
  state = os.path.join(workdir, "checkpoints", str(max(out["e_steps"])),
                       "state")
  files = [os.path.join(d, f) for d, _, fs in os.walk(state) for f in fs]
  biggest = max(files, key=os.path.getsize)
  with open(biggest, "r+b") as f:
    f.truncate(os.path.getsize(biggest) // 2)
  e = subprocess.run(_cmd(workdir, f"--config.train.num_steps={killed_at + 3}"),
                     cwd=REPO, env=child_env(), capture_output=True, text=True,
                     timeout=600)
  out.update(e_rc=e.returncode, e_stderr=e.stderr)
  return out


@pytest.mark.slow
def test_second_run_is_refused_with_one_line_and_first_is_untouched(two_runs):
  r = two_runs
  assert r["b_rc"] == 1
  lines = _ours(r["b_stderr"])
  assert len(lines) <= 2, r["b_stderr"][-3000:]  # absl's E line + error:.
  assert lines[-1].startswith("error: Workdir "), lines
  assert "in use by another run" in lines[-1]
  assert f"pid {r['a_pid']}" in lines[-1] and "started " in lines[-1]
  # A kept training, alone: metrics.jsonl holds each step once, in order.
  assert r["a_alive_after_b"]
  steps = [rec["step"] for rec in r["a_records"]]
  assert steps == list(range(1, len(steps) + 1))
  assert "Took workdir" in r["a_log"] and r["a_log"].count("Took workdir") == 1


@pytest.mark.slow
def test_ctrl_c_commits_a_checkpoint_of_that_step_and_exits_0(two_runs):
  r = two_runs
  assert r["a_rc"] == 0, r["a_log"][-3000:]
  (saved,) = [int(s) for s in re.findall(
      r"Preempted: checkpoint of step (\d+) committed", r["a_log"])]
  assert "Received SIGINT" in r["a_log"]
  assert r["a_records"][-1]["step"] == saved
  assert saved in r["a_steps"] and max(r["a_steps"]) == saved


@pytest.mark.slow
def test_kill9_leaves_no_lock_next_run_takes_over_and_resumes(two_runs):
  r = two_runs
  assert r["d_rc"] == 0, r["d_log"][-3000:]
  (resumed,) = [int(s) for s in re.findall(
      r"Resumed from checkpoint step (\d+)", r["d_log"])]
  assert resumed == max(r["c_steps"]) and resumed > max(r["a_steps"])
  assert r["d_records"][0]["step"] == resumed + 1
  assert "in use by another run" not in r["d_log"]


# ------------------------------------------------------------------------------
# A full disk: the failed async save stops the run at the next step.
# ------------------------------------------------------------------------------
def _file_size_limit():
  """Child: writes past 512 KiB fail with EFBIG (a full disk, per file)."""
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE,
                     (512 * 1024, resource.RLIM_INFINITY))


@pytest.mark.slow
def test_failed_async_save_stops_at_next_step_with_one_line(tmp_path):
  workdir = tmp_path / "run"
  first = in_process.run_main(workdir, *FLAGS,
                              f"--config.train.num_steps={SAVE_EVERY}")
  assert first.returncode == 0, first.stderr[-3000:]
  # Same command, longer, on a "full disk": a save cannot write its arrays
  # (each ~1 MB), in Orbax's background thread. Which save first writes a
  # file past the limit is TensorStore's choice of data files (usually step
  # 20, sometimes 30): the test reads it from the message and checks the
  # behaviour around it.
  proc = subprocess.run(_cmd(workdir, "--config.train.num_steps=60"), cwd=REPO,
                        env=child_env(), capture_output=True, text=True,
                        timeout=600, preexec_fn=_file_size_limit)
  err = proc.stderr
  assert proc.returncode == 1, err[-3000:]
  last = _ours(err)[-1]
  failed = re.match(r"error: Saving checkpoint step (\d+) to ", last)
  assert failed, last
  step = int(failed.group(1))
  older = list(range(SAVE_EVERY, step, SAVE_EVERY))
  assert step % SAVE_EVERY == 0 and 20 <= step < 60 and older, last
  assert last.startswith(
      f"error: Saving checkpoint step {step} to {workdir}/checkpoints/{step} "
      f"failed (cannot write {workdir}/checkpoints/{step}"), last
  assert "File too large" in last and f"steps {older}" in last
  # Stopped at the first step after Orbax's thread reported the failure
  # (the one already running may still log). That is before the next save
  # unless the failing write itself outlasts SAVE_EVERY steps (under load
  # ~9 it did: then the next save waits for it and stops the run, naming
  # the failed step, with nothing of the next step committed).
  lines = err.splitlines()
  reported = next(i for i, ln in enumerate(lines)
                  if "Failed to run" in ln and "background save" in ln)
  logged = [int(m.group(1)) for ln in lines[reported:]
            for m in [re.search(r"\] step (\d+)/60", ln)] if m]
  assert len(logged) <= 1, logged
  steps = [int(m) for m in re.findall(r"\] step (\d+)/60", err)]
  assert step <= max(steps) <= step + SAVE_EVERY, steps
  # One line per error, not hundreds of lines of tracebacks.
  assert "Traceback" not in err and "Event loop is closed" not in err
  # The older checkpoints are intact and the newest of them restores.
  from bert_jax.checkpoints import reading as checkpoint_reading
  assert _steps(workdir) == older
  params, _, restored = checkpoint_reading.load_params(str(workdir))
  assert restored == older[-1] and params


# ------------------------------------------------------------------------------
# Bad inputs: one sentence, exit 1, nothing written; --verbose for the trace.
# ------------------------------------------------------------------------------
def _main(*args):
  return subprocess.run([sys.executable, "-m", "bert_jax.main", *args],
                        cwd=REPO, env=child_env(), capture_output=True,
                        text=True, timeout=300)


def _main_in_process(*args):
  return in_process.run_module("main", *args)


# One case runs `python -m bert_jax.main` as a user does; the others run the
# same entry point in this process (no interpreter start-up to pay).
@pytest.mark.parametrize("case, run", [
    pytest.param("missing_config", _main, marks=pytest.mark.slow,
                 id="missing_config"),
    pytest.param("misspelled_override", _main_in_process,
                 id="misspelled_override"),
    pytest.param("misspelled_group", _main_in_process, id="misspelled_group"),
    pytest.param("workdir_is_a_file", _main_in_process,
                 id="workdir_is_a_file"),
])
def test_bad_input_is_one_sentence_and_writes_nothing(tmp_path, case, run):
  tiny = os.path.join(REPO, "configs", "tiny.py")
  workdir = tmp_path / "run"
  args, expect = {
      "missing_config": (
          ["--config", str(tmp_path / "nope.py")],
          f"error: --config file {tmp_path / 'nope.py'} does not exist"),
      "misspelled_override": (
          ["--config", tiny, "--config.train.num_stepz=3"],
          "error: --config.train.num_stepz: the config has no field "
          "'num_stepz'; did you mean 'num_steps'?"),
      "misspelled_group": (
          ["--config", tiny, "--config.trian.num_steps=3"],
          "error: --config.trian.num_steps: the config has no field 'trian'; "
          "did you mean 'train'?"),
      "workdir_is_a_file": (
          ["--config", tiny], f"error: --workdir={workdir} is not a "
          "directory"),
  }[case]
  if case == "workdir_is_a_file":
    workdir.write_text("not a directory")
  proc = run(*args, "--workdir", str(workdir))
  lines = _ours(proc.stderr)
  assert proc.returncode == 1
  assert 1 <= len(lines) <= 2, proc.stderr[-3000:]
  assert lines[-1].startswith(expect), lines
  assert "Traceback" not in proc.stderr
  if case != "workdir_is_a_file":
    assert not workdir.exists()
  verbose = run(*args, "--workdir", str(workdir), "--verbose")
  assert verbose.returncode != 0 and "Traceback" in verbose.stderr


@pytest.mark.slow
def test_resume_is_quiet_and_a_truncated_checkpoint_is_one_warning(two_runs):
  r = two_runs
  # A resume does not warn that <step>/state/_CHECKPOINT_METADATA (a file
  # Orbax never writes there) does not exist.
  assert "state/_CHECKPOINT_METADATA" not in r["d_log"] + r["e_stderr"]
  assert r["e_rc"] == 0, r["e_stderr"][-3000:]
  bad, good = r["e_steps"][-1], r["e_steps"][-2]
  err = r["e_stderr"]
  assert err.count(f"Checkpoint step {bad} in") == 1, err[-3000:]
  assert f"Resumed from step {good}, the newest good checkpoint" in err
  # No per-array tracebacks (hundreds of lines for BERT-tiny's 30k vocab).
  assert "Traceback" not in err and "Exception ignored" not in err
  assert len(_ours(err)) < 30, len(_ours(err))


def test_unread_checkpoint_coroutines_go_to_the_details_file(monkeypatch,
                                                            tmp_path):
  """An unreadable checkpoint of BERT-tiny (30k vocab) printed ~700 lines:
  one 'Exception ignored in: <coroutine _read_array_index_and_device_put>'
  traceback with the whole TensorStore spec per array, when collected. They
  go to the details file; --verbose prints every one."""
  import types

  from orbax.checkpoint._src.serialization import serialization

  from bert_jax import error_reports
  monkeypatch.setattr(error_reports, "_path", str(tmp_path / "details.txt"))
  monkeypatch.setattr(error_reports, "_fd", None)
  coro = serialization._read_array_index_and_device_put(
      None, None, None, global_shape=None, new_shard_shape=None, dtype=None,
      byte_limiter=None, strict=None, dll=None, memory_kind=None)
  error = Exception("Encountered error while reading array index: (...)")
  for verbose in (False, True):
    printed = []  # What reaches the interpreter's hook (which prints).
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    monkeypatch.setattr(sys, "excepthook", sys.__excepthook__)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)
    error_reports.install(lambda v=verbose: v)
    for obj in (coro, "something else"):
      sys.unraisablehook(types.SimpleNamespace(
          exc_type=Exception, exc_value=error, exc_traceback=None,
          err_msg=None, object=obj))
    if verbose:
      assert [info.object for info in printed] == [coro, "something else"]
    else:
      assert not printed
      details = (tmp_path / "details.txt").read_text()
      assert details.count("Encountered error while reading array") == 2
      assert "_read_array_index_and_device_put" in details
  coro.close()


# A bert_jax.main whose failed save (the test above's full disk) is followed,
# 1.5 s after the run has reported it, by every kind of late report Orbax
# and TensorStore make from their own threads: a thread that dies with a
# traceback, a raw write to file descriptor 2 (C++ logging), a Python print
# to stderr, and an object whose __del__ fails when collected at exit.
_LATE_REPORTS_DRIVER = """
import os, sys, threading, time
from bert_jax.checkpoints import manager
_save_error = manager.Checkpointer._save_error

class Unraisable:
  def __del__(self):
    raise ValueError("LATE-UNRAISABLE collected at exit")

def late():
  time.sleep(1.5)
  os.write(2, b"E1201 tensorstore.cc:1] LATE-FD2 write from C++\\n")
  print("ValueError: OUT_OF_RANGE: LATE-PRINT", file=sys.stderr)
  raise ValueError("OUT_OF_RANGE: LATE-THREAD Error writing opt_state")

def save_error(self, step, error):
  threading.Thread(target=late, name="async_save").start()
  sys.modules["__main__"].keep = Unraisable()
  return _save_error(self, step, error)

manager.Checkpointer._save_error = save_error
from bert_jax import cli, main
cli.run(main.main)
"""


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True])
def test_reports_after_the_error_line_go_to_the_details_file(tmp_path,
                                                             verbose):
  workdir = tmp_path / "run"
  first = in_process.run_main(workdir, *FLAGS,
                              f"--config.train.num_steps={SAVE_EVERY}")
  assert first.returncode == 0, first.stderr[-3000:]
  driver = tmp_path / "driver.py"
  driver.write_text(_LATE_REPORTS_DRIVER)
  cmd = [sys.executable, str(driver), *_cmd(workdir)[3:],
         "--config.train.num_steps=60", *(["--verbose"] if verbose else [])]
  proc = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True,
                        text=True, timeout=600, preexec_fn=_file_size_limit)
  err = proc.stderr
  assert proc.returncode == 1, err[-3000:]
  late = ("LATE-FD2", "LATE-PRINT", "LATE-THREAD", "LATE-UNRAISABLE")
  if verbose:  # Everything prints where it happens.
    assert all(word in err for word in late), err[-3000:]
    assert "Traceback" in err
    return
  # The user's last line is ours, with nothing at all after it.
  last = err.rstrip("\n").splitlines()[-1]
  assert last.startswith("error: Saving checkpoint step "), err[-3000:]
  assert not any(word in err for word in late), err[-3000:]
  # Every late report is in the details file the log line names.
  (path,) = set(re.findall(r"later library messages: (\S+bert_jax_error_"
                           r"\S+\.txt)\)", err))
  details = open(path).read()
  assert all(word in details for word in late), details[-3000:]
  assert "Traceback" in details
  os.remove(path)


# ------------------------------------------------------------------------------
# Ctrl-C twice (and three times): one line, never a traceback.
# ------------------------------------------------------------------------------
# `python -m bert_jax.main` whose checkpoint writes are slow (a big model, a
# far bucket): the preemption save of the first Ctrl-C is still being
# written when the next Ctrl-C comes. SLOW_SAVE sleeps after the save
# started (it is in flight in Orbax's thread); SLOW_WAIT sleeps before the
# wait for it at the end.
_SLOW_SAVE_DRIVER = """
import faulthandler, os, signal, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # Stacks if stuck.
from bert_jax.checkpoints import manager
_save, _wait = manager.Checkpointer.save, manager.Checkpointer.wait

def save(self, step, *args, force=False, **kwargs):
  out = _save(self, step, *args, force=force, **kwargs)
  if force:
    print(f"SAVE STARTED {step}", flush=True)  # One write: read whole.
    time.sleep(float(os.environ["SLOW_SAVE"]))
  return out

def wait(self):
  time.sleep(float(os.environ.get("SLOW_WAIT", "0")))
  return _wait(self)

manager.Checkpointer.save, manager.Checkpointer.wait = save, wait
from bert_jax import cli, main
cli.run(main.main)
"""


@pytest.mark.slow
@pytest.mark.parametrize("presses", [2, 3])
def test_ctrl_c_again_stops_at_once_with_one_line_and_keeps_checkpoints(
    tmp_path, presses):
  workdir = tmp_path / "run"
  driver = tmp_path / "driver.py"
  driver.write_text(_SLOW_SAVE_DRIVER)
  log = open(f"{workdir}.log", "a")
  cmd = [sys.executable, str(driver), *_cmd(workdir)[3:],
         "--config.train.num_steps=100000",
         "--config.checkpoint.save_every_steps=2"]
  proc = subprocess.Popen(
      cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True,
      env=child_env(SLOW_SAVE="60", SLOW_WAIT="60" if presses == 3 else "0"))
  helpers.wait_for_step(proc, workdir, 3)
  proc.send_signal(signal.SIGINT)  # Save this step and exit 0, as documented.
  deadline = time.time() + 300
  while not re.search(r"SAVE STARTED \d+\n", helpers.run_log(workdir)):
    assert proc.poll() is None and time.time() < deadline, (
        helpers.run_log(workdir)[-3000:])
    time.sleep(0.05)
  (saved,) = re.findall(r"SAVE STARTED (\d+)\n", helpers.run_log(workdir))
  for press in range(1, presses):
    proc.send_signal(signal.SIGINT)  # The user does not want to wait.
    if press < presses - 1:
      time.sleep(2)  # Into the (slow) wait for the save in flight.
  try:
    rc = proc.wait(timeout=40)  # Not the 60 s sleeps: at once.
  except subprocess.TimeoutExpired:
    proc.send_signal(signal.SIGUSR1)  # Every thread's stack into the log.
    time.sleep(2)
    proc.kill()
    proc.wait()
    pytest.fail("still running 40 s after the last Ctrl-C:\n" +
                helpers.run_log(workdir)[-8000:])
  out = helpers.run_log(workdir)
  assert rc == 130, out[-3000:]
  assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
  last = _ours(out)[-1]
  if presses == 2:
    # The save in flight was finished before exiting, and is named.
    assert last == (
        "error: Interrupted (Ctrl-C): stopped at once, without saving; the "
        f"newest checkpoint is step {saved}. Run the same command to "
        "resume."), last
  else:
    assert last == (
        "error: Interrupted again: exiting without waiting for the checkpoint "
        "being written; the committed ones are kept. Run the same command to "
        "resume."), last
  # Nothing committed is lost: the newest step restores.
  from bert_jax.checkpoints import reading as checkpoint_reading
  steps = _steps(workdir)
  assert steps and (presses == 3 or max(steps) == int(saved)), steps
  params, _, step = checkpoint_reading.load_params(str(workdir))
  assert step == max(steps) and params


def test_asyncio_records_of_orbax_futures_are_dropped(monkeypatch,
                                                      tmp_path):
  """asyncio logs 'exception was never retrieved' for a future GC'd with its
  error unread. A Task's repr names its coroutine's file; a gather's
  (_GatheringFuture) does not, only its error's traceback runs through
  Orbax (a truncated checkpoint's reads): the filter finds Orbax in that
  traceback and drops the record; another future's error is one line."""
  import logging

  from orbax.checkpoint._src.serialization import serialization

  from bert_jax import cli
  coro = serialization._read_array_index_and_device_put(
      None, None, None, global_shape=None, new_shard_shape=None, dtype=None,
      byte_limiter=None, strict=None, dll=None, memory_kind=None)
  try:
    coro.send(None)  # Raises inside Orbax (no index to read).
  except TypeError as e:
    try:
      raise Exception("Encountered error while reading array index") from e
    except Exception as wrapped:  # pylint: disable=broad-except
      orbax_error = wrapped
  try:
    raise ValueError("not Orbax's")
  except ValueError as e:
    other_error = e

  def record(error):
    return logging.LogRecord(
        "asyncio", logging.ERROR, "/lib/asyncio/base_events.py", 1, "%s",
        ("_GatheringFuture exception was never retrieved\nfuture: "
         f"<_GatheringFuture finished exception={error!r}>",),
        (type(error), error, error.__traceback__))

  from bert_jax import error_reports
  details = tmp_path / "details.txt"
  monkeypatch.setattr(error_reports, "_path", str(details))
  monkeypatch.setattr(error_reports, "_fd", None)
  monkeypatch.setattr(sys, "argv", ["main"])
  quiet = cli._QuietLibraries()
  assert not quiet.filter(record(orbax_error))
  # Another future's error (TensorStore's, with no Orbax frame, reported
  # when collected): one line naming the file, the traceback in it.
  other = record(other_error)
  assert quiet.filter(other) and other.exc_info is None
  assert other.getMessage() == ("_GatheringFuture exception was never "
                                f"retrieved (traceback in {details})")
  text = details.read_text()
  assert "Encountered error while reading array index" in text
  assert "ValueError: not Orbax's" in text and "Traceback" in text
  monkeypatch.setattr(sys, "argv", ["main", "--verbose"])
  assert quiet.filter(record(orbax_error))  # --verbose shows everything.
