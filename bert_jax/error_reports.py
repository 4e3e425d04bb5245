"""Reports of work bert_jax does not own, kept behind the user's last line.

A failed save or a damaged checkpoint is one sentence (`cli`). Orbax and
TensorStore keep working in their own threads after the error has reached
bert_jax: the rest of that save's writes fail one by one, and each reports
through whichever channel its code uses -- a log record with a traceback,
`threading.excepthook` for a thread that dies, `sys.unraisablehook` when an
unfinished coroutine or future is collected, a plain write to file
descriptor 2 from C++ -- at a time set by the machine's load. A filter on
each message's text races with every message not yet seen (an Orbax
`ValueError: OUT_OF_RANGE ...` printed after our line, in one run of a
few). So, without --verbose:

- while the run goes on, the tracebacks of those channels are appended to
  one details file (`bert_jax_error_*.txt` in the temp directory, created
  on first use) instead of the terminal;
- when the run fails, `finish(line)` points file descriptor 2 itself at that
  file and writes `line` to the real stderr: whatever any thread, task, C++
  logger, exit handler or collected object writes afterwards lands in the
  file, so the user's line is the last one on stderr, every time, however
  late the library reports.

With --verbose nothing is redirected or hidden: every report prints where
and when it happens.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable

_lock = threading.Lock()
_path: str | None = None
_fd: int | None = None  # Open for appending: reports come during shutdown,
# when builtins such as open() are already gone.


def details_path() -> str:
  """The details file of this process (created on first use)."""
  global _path, _fd
  with _lock:
    if _path is None:
      fd, _path = tempfile.mkstemp(prefix="bert_jax_error_", suffix=".txt")
      os.close(fd)
    if _fd is None:
      _fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    return _path


def append(text: str) -> str:
  """Add `text` to the details file; returns its path."""
  path = details_path()
  data = (text if text.endswith("\n") else text + "\n").encode(
      "utf-8", "replace")
  with _lock:
    os.write(_fd, data)
  return path


def append_exception(title: str, kind, value, tb) -> str:
  return append(title + "\n" + "".join(
      traceback.format_exception(kind, value, tb)))


def install(verbose: Callable[[], bool]) -> None:
  """Route thread deaths, unraisable errors and the 'Event loop is closed'
  of a closed Orbax loop into the details file (unless `verbose()`).

  A thread that dies keeps one line on stderr (its name and first error
  line, naming the file): a dead input thread of ours must not be silent.
  Unraisable errors (collected coroutines and futures, __del__ failures)
  are only written to the file: after a failed restore or save, Orbax's
  unawaited read and write tasks are collected by the hundred (~60 lines
  each, with the whole TensorStore spec), always after the run has said
  what went wrong.
  """
  previous_thread_hook = threading.excepthook
  previous_hook = sys.excepthook
  previous_unraisable = sys.unraisablehook

  def thread_hook(args):
    if verbose() or args.exc_type is SystemExit:
      previous_thread_hook(args)
      return
    name = args.thread.name if args.thread is not None else "?"
    path = append_exception(f"Exception in thread {name}:", args.exc_type,
                            args.exc_value, args.exc_traceback)
    first = (str(args.exc_value).strip().splitlines() or [""])[0][:300]
    sys.stderr.write(f"Thread {name} failed: {args.exc_type.__name__}: "
                     f"{first} (traceback in {path})\n")

  def hook(kind, value, tb):
    if (not verbose() and isinstance(value, RuntimeError) and
        str(value) == "Event loop is closed"):
      append_exception("Uncaught:", kind, value, tb)
      return
    previous_hook(kind, value, tb)

  def unraisable(info):
    if verbose():
      previous_unraisable(info)
      return
    title = (info.err_msg or "Exception ignored in") + f": {info.object!r}"
    append_exception(title, info.exc_type, info.exc_value, info.exc_traceback)

  threading.excepthook = thread_hook
  sys.excepthook = hook
  sys.unraisablehook = unraisable


def finish(line: str, verbose: bool) -> None:
  """Write `line` as the last thing on stderr.

  Without `verbose`, file descriptor 2 is first pointed at the details file
  (Python's sys.stderr, absl's handler and C++ loggers all write there), so
  nothing written after this call, by any thread or at exit, reaches the
  terminal; `line` goes to the real stderr through a copy of it.
  """
  if verbose:
    print(line, file=sys.stderr, flush=True)
    return
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError):
      pass
  details_path()
  terminal = os.dup(2)
  with _lock:
    os.dup2(_fd, 2)
  try:
    os.write(terminal, (line + "\n").encode("utf-8", "replace"))
  finally:
    os.close(terminal)
