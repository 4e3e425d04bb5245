"""`python -m bert_jax.<name> ARGS` run in this process, as a child runs it.

A command line that fails before any work (a wrong flag, a missing file, a
refused config) costs a child seconds of imports (TensorFlow, JAX) for a
few milliseconds of its own; here it costs those milliseconds. `run_module`
runs the module's own ``if __name__ == "__main__":`` block with sys.argv as
``python -m`` sets it, and returns what `subprocess.run` returns for the
child: the exit status (a SystemExit's code; an uncaught exception prints
its traceback and is 1), stdout and stderr, read from file descriptors 1 and
2 (Python's streams, absl's and Python's log handlers and C++ writes alike).

Each call starts from the state of a new process and leaves the process as
it found it: absl's flags unparsed (before and after) and its app's start-up
done afresh (its log handler, the verbosity it sets; not its faulthandler,
which stays pytest's), Python's root logger without handlers (caplog sees
nothing of the call), `bert_jax.error_reports` with no details file open;
restored afterwards: sys.argv, the environment, the log handlers, filters
and levels, the exception hooks, the SIGINT handler, the garbage
collector's unfrozen objects (`cli.run` freezes them for a fast exit) and
file descriptors 1 and 2 (a failed job points 2 at its details file).

What only a child tests: the interpreter's start and exit (import-time
settings such as TF_CPP_MIN_LOG_LEVEL, exit handlers, late writes of
threads), signals, and a separate memory and device set; keep a subprocess
for those.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import importlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import traceback

from absl import app
from absl import logging as absl_logging

from bert_jax import error_reports
from tests import helpers


def run_module(name: str, *args: str) -> subprocess.CompletedProcess:
  """`python -m bert_jax.<name> *args` in this process: its exit status,
  stdout and stderr."""
  module = importlib.import_module(f"bert_jax.{name}")
  main_block = _main_block(module)
  output = {}
  with _captured(output), _new_process_state([module.__file__, *args]):
    try:
      exec(main_block, vars(module))  # pylint: disable=exec-used
      returncode = 0
    except SystemExit as e:
      returncode = _exit_status(e.code)
    except Exception:  # pylint: disable=broad-except
      traceback.print_exc()  # As the interpreter prints it: exit status 1.
      returncode = 1
  return subprocess.CompletedProcess(
      [sys.executable, "-m", f"bert_jax.{name}", *args], returncode,
      output["stdout"], output["stderr"])


def run_main(workdir, *flags) -> subprocess.CompletedProcess:
  """`helpers.run_main`'s command (the tiny config in `workdir`) in this
  process."""
  return run_module("main", *helpers.tiny_main_args(workdir, *flags))


def _main_block(module):
  """The body of `module`'s ``if __name__ == "__main__":``, compiled."""
  with open(module.__file__) as f:
    tree = ast.parse(f.read(), module.__file__)
  (block,) = [node for node in tree.body if isinstance(node, ast.If) and
              ast.unparse(node.test) == "__name__ == '__main__'"]
  return compile(ast.Module(body=block.body, type_ignores=[]),
                 module.__file__, "exec")


def _exit_status(code) -> int:
  """The interpreter's exit status for sys.exit(code)."""
  if code is None:
    return 0
  if isinstance(code, int):
    return code
  print(code, file=sys.stderr)
  return 1


@contextlib.contextmanager
def _captured(output: dict):
  """File descriptors 1 and 2, and sys.stdout and sys.stderr on them, into
  temporary files; their text in output["stdout"], output["stderr"]."""
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    streams = sys.stdout, sys.stderr
    for stream in streams:
      stream.flush()
    saved = {1: os.dup(1), 2: os.dup(2)}
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    sys.stdout = open(1, "w", closefd=False, encoding="utf-8")  # pylint: disable=consider-using-with
    sys.stderr = open(2, "w", buffering=1, closefd=False, encoding="utf-8",  # pylint: disable=consider-using-with
                      errors="backslashreplace")
    try:
      yield
    finally:
      for stream in (sys.stdout, sys.stderr):
        stream.flush()
        stream.close()
      sys.stdout, sys.stderr = streams
      for fd, copy in saved.items():
        os.dup2(copy, fd)
        os.close(copy)
      for key, f in (("stdout", out), ("stderr", err)):
        f.seek(0)
        output[key] = f.read().decode("utf-8", "replace")


@contextlib.contextmanager
def _new_process_state(argv: list[str]):
  """sys.argv `argv` and the rest of a new process's state (module
  docstring) while the block runs; the process's own afterwards."""
  # pylint: disable=protected-access
  root, absl_logger = logging.getLogger(), logging.getLogger("absl")
  absl_handler = absl_logging.get_absl_handler()
  saved = dict(
      argv=sys.argv, environ=dict(os.environ),
      root_handlers=list(root.handlers), levels=(root.level,
                                                 absl_logger.level),
      absl_stream=absl_handler.python_handler.stream,
      absl_filters=list(absl_handler.filters),
      details=(error_reports._path, error_reports._fd),
      hooks=(threading.excepthook, sys.excepthook, sys.unraisablehook),
      sigint=signal.getsignal(signal.SIGINT),
      frozen=gc.get_freeze_count(),
      app_started=(app._run_init.done,
                   app._register_and_parse_flags_with_usage.done),
      faulthandler=app.faulthandler)
  helpers.unparse_flags()
  app._run_init.done = False
  app._register_and_parse_flags_with_usage.done = False
  # The faulthandler pytest enabled keeps writing to the real stderr (app.run
  # would point it at file descriptor 2, the captured one).
  app.faulthandler = None
  sys.argv = list(argv)
  root.handlers = []
  root.setLevel(logging.WARNING)
  absl_logger.setLevel(logging.NOTSET)
  absl_handler.python_handler.stream = sys.stderr
  error_reports._path, error_reports._fd = None, None
  try:
    yield
  finally:
    if error_reports._fd is not None:
      os.close(error_reports._fd)
    error_reports._path, error_reports._fd = saved["details"]
    threading.excepthook, sys.excepthook, sys.unraisablehook = saved["hooks"]
    signal.signal(signal.SIGINT, saved["sigint"])
    if not saved["frozen"]:
      gc.unfreeze()
    helpers.unparse_flags()
    (app._run_init.done,
     app._register_and_parse_flags_with_usage.done) = saved["app_started"]
    app.faulthandler = saved["faulthandler"]
    absl_handler.python_handler.stream = saved["absl_stream"]
    absl_handler.filters[:] = saved["absl_filters"]
    root.handlers = saved["root_handlers"]
    root.setLevel(saved["levels"][0])
    absl_logger.setLevel(saved["levels"][1])
    for key in set(os.environ) - set(saved["environ"]):
      del os.environ[key]
    os.environ.update(saved["environ"])
    sys.argv = saved["argv"]
