"""What every command-line entry point and tool shares: flags, multi-host
start-up, quiet libraries and errors as sentences.

Flags are absl flags, and a flag every command shares has one definition
here, so one spelling and one meaning: `--config` (a config file and its
`--config.group.field=` overrides), `--workdir`, `--model` (a workdir,
checkpoint or Hugging Face directory to read), `--step`, `--output`,
`--verbose`. A command defines its flags in `define_flags(flag_values,
argv)` and is run one of two ways:

- a job (`bert_jax.main`, `bert_jax.finetune`, the tools that train or
  time a train step) runs under absl's app with `run(main, define_flags)`:
  its flags live in absl's FLAGS, its absl log lines reach stderr, and an
  error the user can fix is one `error: ...` line (the traceback behind
  --verbose). The pretraining and fine-tuning jobs share `define_job_flags`.
- a command whose `main(argv) -> int` is also called in process
  (`bert_jax.fill_mask`, `bert_jax.to_hf`, the data and checking tools)
  parses into a fresh FlagValues each call with `parse(argv, define_flags,
  doc)`: two commands whose flags share a name can live in one process.
"""

import functools
import gc
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

FLAGS = flags.FLAGS


# ------------------------------------------------------------------------------
# Flags every command shares: one definition each.
# ------------------------------------------------------------------------------
def define_config(help_string: str, *, flag_values=FLAGS, argv=None,
                  required: bool = True, lock_config: bool = True) -> None:
  """--config FILE and its --config.group.field=VALUE overrides (`argv`:
  the command line they are read from; None: sys.argv)."""
  config_flags.DEFINE_config_file("config", None, help_string,
                                  flag_values=flag_values,
                                  lock_config=lock_config, sys_argv=argv)
  if required:
    flags.mark_flag_as_required("config", flag_values=flag_values)


def define_workdir(help_string: str, *, flag_values=FLAGS,
                   default: str | None = None, required: bool = True) -> None:
  """--workdir: the directory of a run (required unless it has a default)."""
  flags.DEFINE_string("workdir", default, help_string, flag_values=flag_values)
  if required and default is None:
    flags.mark_flag_as_required("workdir", flag_values=flag_values)


def define_model(help_string: str, *, flag_values=FLAGS, required: bool = True,
                 aliases: tuple[str, ...] = ()) -> None:
  """--model: the workdir, checkpoint or Hugging Face directory a command
  reads; `aliases` keep a documented older spelling working."""
  flags.DEFINE_string("model", None, help_string, flag_values=flag_values)
  for alias in aliases:
    flags.DEFINE_alias(alias, "model", flag_values=flag_values)
  if required:
    flags.mark_flag_as_required("model", flag_values=flag_values)


def define_step(*, flag_values=FLAGS) -> None:
  """--step: a checkpoint step of a workdir."""
  flags.DEFINE_integer("step", None, "Checkpoint step of a workdir (default: "
                       "the latest).", flag_values=flag_values)


def define_output(help_string: str, *, flag_values=FLAGS,
                  default: str | None = None, required: bool = True,
                  aliases: tuple[str, ...] = ()) -> None:
  """--output: what a command writes; `aliases` keep a documented older
  spelling (--out) working."""
  flags.DEFINE_string("output", default, help_string, flag_values=flag_values)
  for alias in aliases:
    flags.DEFINE_alias(alias, "output", flag_values=flag_values)
  if required and default is None:
    flags.mark_flag_as_required("output", flag_values=flag_values)


def define_timing(*, flag_values=FLAGS, steps: int = 3, rounds: int = 3,
                  warmup: int = 1, steps_help: str = "") -> None:
  """--steps, --rounds, --warmup of the speed tools: `warmup` untimed steps
  per side, then `rounds` rounds of `steps` timed steps per side in turn
  (``bert_jax.benchmarking.alternate``)."""
  flags.DEFINE_integer("steps", steps, steps_help or "Timed steps per side "
                       "per round.", flag_values=flag_values)
  flags.DEFINE_integer("rounds", rounds, "Rounds; the sides take turns in "
                       "each.", flag_values=flag_values)
  flags.DEFINE_integer("warmup", warmup, "Untimed steps per side after "
                       "compiling.", flag_values=flag_values)


def define_verbose(*, flag_values=FLAGS) -> None:
  flags.DEFINE_bool("verbose", False, "Print full tracebacks instead of "
                    "one-line errors, and the libraries' INFO lines.",
                    flag_values=flag_values)


def define_distributed(*, flag_values=FLAGS) -> None:
  """--distributed and the jax.distributed flags of a multi-process job."""
  flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                    "auto: initialize jax.distributed when the environment or "
                    "--coordinator_address describe several processes.",
                    flag_values=flag_values)
  flags.DEFINE_string("coordinator_address", None, "host:port of process 0.",
                      flag_values=flag_values)
  flags.DEFINE_integer("num_processes", None, "Total number of processes.",
                       flag_values=flag_values)
  flags.DEFINE_integer("process_id", None, "Index of this process.",
                       flag_values=flag_values)


def define_job_flags(flag_values=FLAGS) -> None:
  """The flags of a training job: --config, --workdir, the jax.distributed
  flags, --take_over_workdir and --verbose. Every job defines the same ones:
  defined once however many job modules a process imports."""
  if "workdir" in flag_values:
    return
  define_config("Path to a config file in configs/.", flag_values=flag_values)
  define_workdir("Checkpoints, metrics and TensorBoard.",
                 flag_values=flag_values)
  define_distributed(flag_values=flag_values)
  flags.DEFINE_bool("take_over_workdir", False,
                    "Take over a gs:// (object-store) workdir whose lock names "
                    "a run on another host that cannot be checked (use only if "
                    "that run is dead). A local or NFS workdir needs none: a "
                    "dead run's lock is free, a live run's is never taken.",
                    flag_values=flag_values)
  define_verbose(flag_values=flag_values)


# Environment variables set on Cloud TPU VM slices and by SLURM/MPI launchers.
_MULTIHOST_ENV = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS",
                  "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def wants_distributed(flag_values=FLAGS) -> bool:
  """Whether --distributed (auto: the environment or --coordinator_address)
  asks for jax.distributed."""
  if flag_values.distributed == "off":
    return False
  if flag_values.distributed == "on" or flag_values.coordinator_address:
    return True
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts:
    return True
  return any(int(os.environ.get(v, "1") or 1) > 1
             for v in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))


def initialize_distributed() -> None:
  if not wants_distributed():
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
  if FLAGS.is_parsed() and "verbose" in FLAGS:
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
  error_reports.finish(line, verbose=_verbose())


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


def _parse_into(flag_values, argv, help_flag: str) -> list[str]:
  """absl flag parsing, with config-file and override errors as sentences;
  returns the arguments that are not flags (the program name first)."""
  try:
    rest = flag_values(argv)
  except flags.Error as e:
    _fail(f"{str(e).rstrip('.')}. Run with {help_flag} for the flags.", argv)
  except (AttributeError, KeyError) as e:  # --config.group.misspelled=...
    _fail(_override_error(argv, e), argv)
  except (OSError, ValueError, TypeError) as e:
    _fail(f"{_first_line(e)}", argv)
  if "config" in flag_values and _flag_value(argv, "config") is not None:
    try:
      getattr(flag_values.config, "to_dict")  # Raises if the file did not load.
    except OSError:
      _fail(_config_load_error(argv), argv)
  try:  # file:///dir -> /dir: one path form for the lock, Orbax and TF.
    if "workdir" in flag_values and flag_values.workdir:
      flag_values.workdir = checkpoint_reading.local_path(flag_values.workdir)
  except ValueError as e:
    _fail(f"--workdir: {e}", argv)
  return rest


def parse_flags(argv):
  """absl's FLAGS parsed from `argv`, errors as sentences (app.run's
  flags_parser)."""
  return _parse_into(FLAGS, argv, "--helpfull")


_HELP = ("--help", "-h", "--helpfull", "--helpshort")


def parse(argv, define, doc: str, *, positional: bool = False):
  """The flags `define(flag_values, argv)` defines, on a fresh FlagValues,
  parsed from `argv` (the arguments after the program name; None:
  sys.argv's). Returns (flag values, positional arguments). --help prints
  `doc` and the flags; a wrong flag, a missing required one, or a positional
  argument to a command that takes none (`positional` False), is one
  `error: ...` line and exit 1."""
  prog = os.path.basename(sys.argv[0]) if sys.argv else "bert_jax"
  argv = [prog] + list(sys.argv[1:] if argv is None else argv)
  flag_values = flags.FlagValues()
  define(flag_values, argv)
  if any(a in _HELP for a in argv[1:]):
    print(doc.strip() + "\n\nflags:")
    for name in sorted(flag_values):
      flag = flag_values[name]
      default = "" if flag.default is None else f" (default: {flag.default!r})"
      print(f"  --{name}: {flag.help}{default}")
    sys.exit(0)
  args = _parse_into(flag_values, argv, "--help")[1:]
  if args and not positional:
    _fail(f"unexpected argument {args[0]!r}: this command takes flags only. "
          "Run with --help for the flags.", argv)
  return flag_values, args


def _first_line(e: BaseException) -> str:
  lines = str(e).strip().splitlines()
  return lines[0] if lines else type(e).__name__


def _unexpected(e: Exception):
  """A bug or an unforeseen fault: one line, the traceback in a file."""
  if _verbose():
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
  if _verbose():
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
    if _verbose():
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


def run(main, define=None):
  """Run a job: `define(FLAGS, sys.argv)`'s flags (if given) on absl's
  FLAGS, then `main` under absl's app."""
  if define is not None:
    define(FLAGS, sys.argv)
  try:
    app.run(main, flags_parser=parse_flags)
  except KeyboardInterrupt:  # Outside `call`: flag parsing, the last print.
    _interrupted()
  finally:
    signal.signal(signal.SIGINT, _exit_at_once)
    # Python's exit collects every object left (TensorFlow's: over a second,
    # docs/performance.md#command-exit); frozen ones are skipped. Nothing is
    # lost: the job closed its files and committed its saves, and the exit
    # still flushes stdout and stderr.
    gc.freeze()
