"""What every command-line entry point shares: flags, multi-host start-up,
quiet libraries and errors as sentences.

`bert_jax.main` (pretraining) and `bert_jax.finetune` define their jobs;
this module defines `--config`, `--workdir`, the `jax.distributed` flags,
`--take_over_workdir` and `--verbose`, parses them with config-file and
override errors turned into one line, and runs a job so that an error the
user can fix is one `error: ...` line (the traceback behind --verbose).
"""

import functools
import importlib.util
import os
import re
import signal
import sys
import traceback

# TensorFlow (the input pipeline, on the host CPU) looks for CUDA when it
# starts and logs "failed call to cuInit: ... CUDA error" on every machine
# without an NVIDIA driver; JAX, not TensorFlow, drives the accelerators.
# Its C++ log shows FATAL only unless the user chose a level, or --verbose.
# Set before jax is imported (it sets a default of its own) and before
# TensorFlow (which reads the level once).
if not any(a in ("--verbose", "--verbose=true", "--verbose=True")
           for a in sys.argv):
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top,wrong-import-position
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from bert_jax import error_reports
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.checkpoints import workdir_lock

config_flags.DEFINE_config_file(
    "config", None, "Path to a config file in configs/.", lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and TensorBoard.")
flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                  "auto: initialize jax.distributed when the environment or "
                  "the flags below describe several processes.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Total number of processes.")
flags.DEFINE_integer("process_id", None, "Index of this process.")
flags.DEFINE_bool("take_over_workdir", False,
                  "Take over a gs:// (object-store) workdir whose lock names "
                  "a run on another host that cannot be checked (use only if "
                  "that run is dead). A local or NFS workdir needs none: a "
                  "dead run's lock is free, a live run's is never taken.")
flags.DEFINE_bool("verbose", False,
                  "Print full tracebacks instead of one-line errors.")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS

# Environment variables set on Cloud TPU VM slices and by SLURM/MPI launchers.
_MULTIHOST_ENV = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS",
                  "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def _wants_distributed() -> bool:
  if FLAGS.distributed == "off":
    return False
  if FLAGS.distributed == "on" or FLAGS.coordinator_address:
    return True
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts:
    return True
  return any(int(os.environ.get(v, "1") or 1) > 1
             for v in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))


def initialize_distributed() -> None:
  if not _wants_distributed():
    return
  kwargs = {}
  if FLAGS.coordinator_address:
    kwargs = dict(coordinator_address=FLAGS.coordinator_address,
                  num_processes=FLAGS.num_processes,
                  process_id=FLAGS.process_id)
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # Surface one line naming what failed.
    raise RuntimeError(
        f"jax.distributed.initialize({kwargs or 'from environment'}) failed: "
        f"{e}") from e
  logging.info("Process %d of %d; %d local / %d global devices.",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


# Libraries whose INFO records are theirs, not the run's: Orbax's per-save
# lines, JAX's "Unable to initialize backend 'tpu'", TensorFlow's saver.
# Known by the file that logs (most log through absl's logger): under the
# directory the package is installed in.
_LIBRARIES = ("orbax", "jax", "jaxlib", "tensorflow")


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
  dirs = []
  for name in _LIBRARIES:
    try:
      spec = importlib.util.find_spec(name)  # Finds; imports nothing.
    except (ImportError, ValueError):
      continue
    for d in (spec.submodule_search_locations or []) if spec else []:
      dirs.append(os.path.join(os.path.realpath(d), ""))
  return tuple(dirs)


def _from_library(record) -> bool:
  return _in_library(record.pathname)


@functools.lru_cache(maxsize=1024)
def _in_library(path: str) -> bool:
  return os.path.realpath(path).startswith(_library_dirs())


# Standard-library loggers that report other code's task and future errors.
_STDLIB_REPORTERS = ("asyncio", "concurrent.futures")


class _QuietLibraries:
  """Drop the INFO chatter of Orbax, JAX and TensorFlow; keep their warnings
  (everything with --verbose).

  A failed save makes Orbax log the same error with a traceback from each of
  its threads; the run stops with one sentence about it (CheckpointSaveError),
  so without --verbose their records keep one line each, the traceback going
  to the details file (`error_reports`). asyncio and concurrent.futures
  report the errors of the libraries' tasks and futures under their own
  names: treated as library records.
  """

  def filter(self, record) -> bool:
    if _verbose():
      return True
    if record.name == "asyncio" and _from_orbax(record):
      # "Task exception was never retrieved" of a failed save's writes.
      error_reports.append_exception(record.getMessage(), *record.exc_info)
      return False
    if not (_from_library(record) or record.name in _STDLIB_REPORTERS):
      return True
    if record.levelno < 30:
      return False
    if record.exc_info:
      path = error_reports.append_exception(record.getMessage(),
                                            *record.exc_info)
      record.exc_info, record.exc_text = None, None
      record.msg = (f"{_first_line(record.getMessage())[:300]} (traceback in "
                    f"{path})")
      record.args = ()
    return True


def _from_orbax(record) -> bool:
  """An asyncio record about an Orbax future: a Task's repr names its
  coroutine's file; a gather's names none, its error's traceback does."""
  if "/orbax/" in record.getMessage():
    return True
  error = record.exc_info[1] if record.exc_info else None
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    tb = error.__traceback__
    while tb is not None:
      if "/orbax/" in tb.tb_frame.f_code.co_filename:
        return True
      tb = tb.tb_next
    error = error.__cause__ or error.__context__
  return False


# ------------------------------------------------------------------------------
# Errors as sentences: one line for the user, the traceback behind --verbose.
# ------------------------------------------------------------------------------
def _verbose(argv=None) -> bool:
  if FLAGS.is_parsed():
    return FLAGS.verbose
  return any(a in ("--verbose", "--verbose=true", "--verbose=True")
             for a in (argv or sys.argv))


def _fail(message: str, argv=None):
  """Print `error: message` and exit 1 (re-raise instead with --verbose)."""
  if _verbose(argv) and sys.exc_info()[0] is not None:
    raise  # pylint: disable=misplaced-bare-raise
  print(f"error: {message}", file=sys.stderr)
  sys.exit(1)


def _last_line(line: str) -> None:
  """`line` last on stderr: later reports of libraries go to the details
  file (error_reports.finish)."""
  error_reports.finish(line, verbose=FLAGS.is_parsed() and FLAGS.verbose)


def _flag_value(argv, name: str) -> str | None:
  for i, a in enumerate(argv):
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
  return None


def _config_load_error(argv) -> str:
  path = _flag_value(argv, "config") or "?"
  file = path.split(":")[0] if not os.path.exists(path) else path
  if not os.path.exists(file):
    return (f"--config file {file} does not exist; pass a config file such "
            "as configs/tiny.py.")
  return (f"--config file {file} could not be loaded; run python {file} to "
          "see why.")


def _override_error(argv, e: Exception) -> str:
  """ml_collections' 'no such field' error -> the flag, and its suggestion."""
  text = str(e)
  m = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
  key = m.group(2) if m else (re.findall(r"\w+", text) or ["?"])[0]
  flag = next((a.split("=")[0] for a in argv if a.startswith("--config.") and
               key in a.split("=")[0].split(".")), f"--config.*.{key}")
  hint = f"; did you mean {m.group(1)!r}?" if m else "."
  return (f"{flag}: the config has no field {key!r}{hint} Fields are listed "
          "in bert_jax/config_lib.py.")


def parse_flags(argv):
  """absl flag parsing, with config-file and override errors as sentences."""
  try:
    rest = FLAGS(argv)
  except flags.Error as e:
    _fail(f"{e}. Run with --helpfull for the flags.", argv)
  except (AttributeError, KeyError) as e:  # --config.group.misspelled=...
    _fail(_override_error(argv, e), argv)
  except (OSError, ValueError, TypeError) as e:
    _fail(f"{_first_line(e)}", argv)
  try:
    getattr(FLAGS.config, "to_dict")  # Raises here if the file did not load.
  except OSError:
    _fail(_config_load_error(argv), argv)
  try:  # file:///dir -> /dir: one path form for the lock, Orbax and TF.
    if FLAGS.workdir:
      FLAGS.workdir = checkpoint_reading.local_path(FLAGS.workdir)
  except ValueError as e:
    _fail(f"--workdir: {e}", argv)
  return rest


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return lines[0] if lines else type(e).__name__


def _unexpected(e: Exception):
  """A bug or an unforeseen fault: one line, the traceback in a file."""
  if FLAGS.verbose:
    raise  # pylint: disable=misplaced-bare-raise
  path = error_reports.append(traceback.format_exc())
  logging.error("%s: %s (traceback in %s)", type(e).__name__, _first_line(e),
                path)
  _last_line(f"error: {type(e).__name__}: {_first_line(e)} (traceback in "
             f"{path}; rerun with --verbose to print it)")
  sys.exit(1)



def setup() -> None:
  """Quiet the libraries and start jax.distributed when asked to."""
  logging.get_absl_handler().addFilter(_QuietLibraries())
  error_reports.install(_verbose)
  initialize_distributed()


# Exit status of a run stopped by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED_EXIT = 130


def _interrupted_by_user(e: BaseException) -> bool:
  """KeyboardInterrupt, or an error raised while one unwound (a library's
  cleanup that failed because the interrupt cut it short)."""
  seen = set()
  while e is not None and id(e) not in seen:
    if isinstance(e, KeyboardInterrupt):
      return True
    seen.add(id(e))
    e = e.__context__
  return False


def _interrupted():
  """Ctrl-C that stops the run at once (a second one during training, or the
  first before training started): one line naming the checkpoint a rerun
  resumes from, exit 130. The job's cleanup (waiting for a save in flight,
  the workdir lock) has run by now."""
  if FLAGS.is_parsed() and FLAGS.verbose:
    raise  # pylint: disable=misplaced-bare-raise
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # Exiting now: no more of it.
  kept = "no checkpoint was saved"
  try:
    steps = checkpoint_reading.committed_steps(FLAGS.workdir)
    if steps:
      kept = f"the newest checkpoint is step {steps[-1]}"
  except Exception:  # pylint: disable=broad-except
    pass  # No workdir yet, or a tool without one.
  logging.error("Interrupted (Ctrl-C): stopped at once.")
  _last_line(f"error: Interrupted (Ctrl-C): stopped at once, without saving; "
             f"{kept}. Run the same command to resume.")
  sys.exit(INTERRUPTED_EXIT)


def call(job):
  """Run `job()`; user-fixable errors become one line and exit 1, Ctrl-C
  one line and exit 130."""
  try:
    return job()
  except KeyboardInterrupt:
    _interrupted()
  except (ValueError, OSError, FloatingPointError,
          workdir_lock.WorkdirInUseError) as e:
    if _interrupted_by_user(e):
      _interrupted()
    if FLAGS.verbose:
      raise
    logging.error("%s (later library messages: %s)", e,
                  error_reports.details_path())
    _last_line(f"error: {e}")
    sys.exit(1)
  except Exception as e:  # pylint: disable=broad-except
    if _interrupted_by_user(e):
      _interrupted()
    _unexpected(e)


def _exit_at_once(signum, frame):
  """SIGINT once the job has returned: nothing is left to save, so the
  interpreter's teardown is not interrupted into a traceback."""
  del signum, frame
  os._exit(INTERRUPTED_EXIT)  # pylint: disable=protected-access


def run(main):
  try:
    app.run(main, flags_parser=parse_flags)
  except KeyboardInterrupt:  # Outside `call`: flag parsing, the last print.
    _interrupted()
  finally:
    signal.signal(signal.SIGINT, _exit_at_once)
