"""One writer per workdir: a run takes its workdir and refuses a second one.

Two runs writing one workdir replace each other's checkpoints and interleave
``metrics.jsonl``. A run therefore takes the workdir before it writes
anything there:

- Local disk: ``fcntl.flock`` on ``WORKDIR/.workdir_lock.json``, which also
  holds the holder's identity (host, pid, start time, command). The kernel
  drops the lock when the process dies (kill -9 included), so a dead run
  never blocks the next one, and a held lock means a live holder: it is
  never taken over (``--take_over_workdir`` is for object stores only).
- Any other ``tf.io.gfile`` path (``gs://...``): object stores have no
  locks, so the same file is an identity object written at start and read
  back before every save; a run that finds another run's identity there
  stops with one line. A lock left by a dead run on this host (same host,
  pid not alive) is taken over with a warning; one from another host cannot
  be checked and needs ``--take_over_workdir``.

Multi-host: process 0 takes the workdir for the job; the others learn the
outcome through a broadcast, so they stop with it rather than hang.

A run that ends with an error (a refusal of its input, a crash) removes what
taking the workdir created: the lock file, when it made it, and the
directories it made for the workdir, when they are empty. A refused run in a
fresh workdir leaves the filesystem as it found it; a finished or preempted
run keeps its lock file for the next one.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import uuid

import jax
import numpy as np
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

LOCK_NAME = ".workdir_lock.json"


class WorkdirInUseError(RuntimeError):
  """Another run holds the workdir (the message names it)."""


def _is_local(path: str) -> bool:
  return "://" not in path


def identity() -> dict:
  """Who this run is: what a refused second run prints about the holder."""
  return dict(
      host=socket.gethostname(), pid=os.getpid(),
      start=datetime.datetime.now(datetime.timezone.utc).strftime(
          "%Y-%m-%d %H:%M:%S UTC"),
      command=" ".join([os.path.basename(sys.executable)] + sys.argv)[:500],
      run_id=uuid.uuid4().hex)


def describe(holder: dict) -> str:
  return (f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
          f"started {holder.get('start', '?')}")


def _pid_alive(pid) -> bool:
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except (PermissionError, TypeError, ValueError):
    return True  # Exists but not ours, or unreadable: assume alive.
  return True


def _missing_dirs(path: str) -> list[str]:
  """`path` and its ancestors that do not exist yet, deepest first."""
  missing = []
  path = os.path.abspath(path)
  while not os.path.exists(path):
    missing.append(path)
    parent = os.path.dirname(path)
    if parent == path:
      break
    path = parent
  return missing


def prepare_workdir(workdir: str) -> list[str]:
  """Create `workdir`; ValueError with one sentence if it cannot be written.
  Returns the directories it created, deepest first (local paths; [] for
  object stores, whose directories are names)."""
  created = []
  try:
    if _is_local(workdir):
      if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise NotADirectoryError(f"{workdir} is a file")
      created = _missing_dirs(workdir)
      try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write_probe_{os.getpid()}")
        with open(probe, "w") as f:
          f.write("ok")
        os.remove(probe)
      except OSError:
        remove_created(created)  # A workdir it cannot write: none at all.
        raise
    else:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      tf.io.gfile.makedirs(workdir)
  except NotADirectoryError:
    raise ValueError(
        f"--workdir={workdir} is not a directory (a file, or a path under "
        "one): pass a directory path.") from None
  except PermissionError as e:
    raise ValueError(
        f"--workdir={workdir} is not writable ({e.strerror}): choose a "
        "directory you can write, or fix its permissions.") from None
  except OSError as e:
    raise ValueError(f"--workdir={workdir} cannot be created or written "
                     f"({e.strerror or e}).") from None
  return created


def remove_created(created: list[str]) -> None:
  """Remove the directories `prepare_workdir` created (deepest first),
  each only when empty: what a failed run leaves of itself."""
  for d in created:
    try:
      os.rmdir(d)
    except OSError:
      return  # Not empty (or gone): it and its parents stay.


def write_identity(path: str, ident: dict) -> None:
  """Replace the identity object at `path` (tf.io.gfile: gs://, ram://...)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if tf.io.gfile.exists(path):
    tf.io.gfile.remove(path)  # ram:// overwrites in place without truncating.
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(json.dumps(ident))


class WorkdirLock:
  """Holds `workdir` for this run; `verify()` before each save."""

  def __init__(self, workdir: str, take_over: bool = False):
    self.workdir = workdir.rstrip("/") if not _is_local(workdir) else workdir
    self.path = os.path.join(self.workdir, LOCK_NAME)
    self.take_over = take_over
    self.me = identity()
    self._fd = None
    self.held = False
    self.created_file = False  # This run made the lock file (local disk).
    self.created_dirs: list[str] = []  # What take() made for the workdir.

  # ---- Local disk: flock.
  def _acquire_local(self):
    try:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
      self.created_file = True
    except FileExistsError:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      # The kernel (or the NFS lock manager) holds the lock for a live
      # process only: that run is alive, wherever it runs, and
      # --take_over_workdir does not change that (a dead holder's lock is
      # free, and taken below without it).
      holder = self._read_fd(fd)
      os.close(fd)
      raise WorkdirInUseError(self._refusal(holder, alive=True)) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(self.me).encode(), 0)
    os.fsync(fd)
    self._fd = fd

  @staticmethod
  def _read_fd(fd) -> dict:
    try:
      return json.loads(os.pread(fd, 65536, 0).decode() or "{}")
    except ValueError:
      return {}

  # ---- Object stores: identity object.
  def _read_object(self) -> dict | None:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    if not tf.io.gfile.exists(self.path):
      return None
    try:
      with tf.io.gfile.GFile(self.path, "r") as f:
        return json.loads(f.read() or "{}")
    except ValueError:
      return {}

  def _write_object(self):
    write_identity(self.path, self.me)

  def _acquire_object(self):
    holder = self._read_object()
    if holder is not None:
      same_host = holder.get("host") == self.me["host"]
      if same_host and not _pid_alive(holder.get("pid")):
        logging.warning("Taking over %s: the run that held it (%s) is no "
                        "longer alive.", self.workdir, describe(holder))
      elif self.take_over and not same_host:
        logging.warning("--take_over_workdir: taking over %s from %s.",
                        self.workdir, describe(holder))
      else:
        raise WorkdirInUseError(self._refusal(holder))
    self._write_object()

  def _refusal(self, holder: dict, alive: bool = False) -> str:
    what = (f"Workdir {self.workdir} is in use by another run ({describe(holder)}"
            f"{'; ' + holder['command'] if holder.get('command') else ''}).")
    if alive:
      why = ("; --take_over_workdir takes only a workdir whose holder is "
             "gone" if self.take_over else "")
      return (f"{what[:-1]}: its lock is held, so that run is alive{why}. "
              "Wait for it to finish or use another --workdir.")
    if holder.get("host") not in (None, self.me["host"]) and not self.take_over:
      return (what + " Wait for it to finish or use another --workdir; if "
              "that run is dead, rerun with --take_over_workdir.")
    return what + " Wait for it to finish or use another --workdir."

  # ---- Public.
  def acquire(self) -> "WorkdirLock":
    if _is_local(self.workdir):
      self._acquire_local()
    else:
      self._acquire_object()
    self.held = True
    logging.info("Took workdir %s (%s).", self.workdir, describe(self.me))
    return self

  def verify(self) -> None:
    """Before a save: raise WorkdirInUseError if another run took over.

    A flock cannot be taken from a live process, so only object-store
    workdirs are read back here.
    """
    if not self.held or _is_local(self.workdir):
      return
    holder = self._read_object()
    if holder is None:
      logging.warning("The workdir lock %s disappeared; writing it again.",
                      self.path)
      self._write_object()
    elif holder.get("run_id") != self.me["run_id"]:
      self.held = False
      raise WorkdirInUseError(
          f"Another run took over {self.workdir} ({describe(holder)}); this "
          "run stops without saving so that it does not overwrite that run's "
          "checkpoints.")

  def release(self, failed: bool = False) -> None:
    """Let the workdir go. `failed` (the run ended with an error): also
    remove the lock file if this run made it (unlinked while still held)
    and the directories take() made, when empty."""
    if not self.held:
      return
    self.held = False
    if self._fd is not None:
      if failed and self.created_file:
        try:
          os.unlink(self.path)
        except OSError as e:
          logging.warning("Could not remove %s: %s", self.path, e)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None
      if failed:
        remove_created(self.created_dirs)
      return
    if not _is_local(self.workdir):
      try:
        if (self._read_object() or {}).get("run_id") == self.me["run_id"]:
          import tensorflow as tf  # pylint: disable=g-import-not-at-top
          tf.io.gfile.remove(self.path)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("Could not remove %s: %s", self.path, e)


class _Nothing:
  """What processes other than 0 hold: nothing to verify or release."""

  def verify(self):
    pass

  def release(self, failed: bool = False):
    del failed


def take(workdir: str, take_over: bool = False):
  """Process 0 creates and takes `workdir` for the job; all processes raise
  if it is refused (WorkdirInUseError) or not writable (ValueError).

  Returns an object with ``verify()`` (call before every save, on every
  process) and ``release()``.
  """
  error, lock = None, _Nothing()
  if jax.process_index() == 0:
    created = []
    try:
      created = prepare_workdir(workdir)
      lock = WorkdirLock(workdir, take_over).acquire()
      lock.created_dirs = created
    except (WorkdirInUseError, ValueError) as e:
      remove_created(created)  # In use by another run: created is [].
      error = e
  if jax.process_count() > 1:
    refused = int(multihost_utils.broadcast_one_to_all(
        np.int32(error is not None)))
    if refused and error is None:
      error = WorkdirInUseError(
          f"Process 0 could not take --workdir={workdir} (its log says "
          "why).")
    lock = _Broadcasting(lock)
  if error is not None:
    raise error
  return lock


class _Broadcasting:
  """Multi-host: process 0's verify() outcome reaches every process."""

  def __init__(self, lock):
    self.lock = lock

  def verify(self):
    error = None
    try:
      self.lock.verify()
    except WorkdirInUseError as e:
      error = e
    lost = int(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
    if error is not None:
      raise error
    if lost:
      raise WorkdirInUseError("Another run took over the workdir (process 0 "
                              "says which); stopping without saving.")

  def release(self, failed: bool = False):
    self.lock.release(failed)


@contextlib.contextmanager
def hold(workdir: str, take_over: bool = False):
  """Take `workdir` for this run, check that every host sees it (multi-host
  runs need shared storage), and release it at the end (after an error,
  removing what taking it created: see the module docstring)."""
  lock = take(workdir, take_over=take_over)
  failed = True
  try:
    check_workdir_shared(workdir)
    yield lock
    failed = False
  finally:
    lock.release(failed)


def check_workdir_shared(workdir: str) -> None:
  """Raise ValueError unless every process sees files process 0 writes there.

  A local path on a multi-host TPU slice is a different directory on each
  host: checkpoints would be split across machines and unrestorable. Call on
  all processes before training; a no-op with one process.
  """
  if jax.process_count() == 1:
    return
  token = np.frombuffer(uuid.uuid4().bytes[:8], np.int64).copy()
  token = multihost_utils.broadcast_one_to_all(token)
  probe = epath.Path(workdir) / f".bert_jax_shared_probe_{int(token[0]):x}"
  if jax.process_index() == 0:
    probe.parent.mkdir(parents=True, exist_ok=True)
    probe.write_text(str(int(token[0])))
  multihost_utils.sync_global_devices("bert_jax_workdir_probe_written")
  try:
    seen = probe.exists() and probe.read_text() == str(int(token[0]))
  except OSError:
    seen = False
  seen_all = np.asarray(multihost_utils.process_allgather(
      np.asarray([int(seen)], np.int32))).reshape(-1)
  multihost_utils.sync_global_devices("bert_jax_workdir_probe_read")
  if jax.process_index() == 0:
    probe.unlink(missing_ok=True)
  missing = [i for i, ok in enumerate(seen_all) if not ok]
  if missing:
    raise ValueError(
        f"--workdir={workdir} is not shared between processes: process(es) "
        f"{missing} of {jax.process_count()} cannot see a file process 0 "
        "wrote there. Multi-host runs need a workdir every host reaches "
        "(e.g. gs://bucket/run or a shared NFS mount); checkpoints on local "
        "disks would be split across hosts and could not be restored.")
