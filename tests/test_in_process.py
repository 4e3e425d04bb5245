"""tests/helpers/in_process: an entry point run in this process leaves it as
it was, whatever the run changed (flags, hooks, log handlers, SIGINT, the
garbage collector's frozen objects, file descriptor 2)."""

import gc
import logging
import os
import signal
import sys
import threading

from bert_jax import cli
from bert_jax import error_reports
from tests import helpers
from tests.helpers import in_process


def _state():
  return dict(
      parsed=cli.FLAGS.is_parsed(),
      overrides=[n for n in cli.FLAGS if n.startswith("config.")],
      argv=list(sys.argv), root=list(logging.getLogger().handlers),
      levels=(logging.getLogger().level, logging.getLogger("absl").level),
      hooks=(threading.excepthook, sys.excepthook, sys.unraisablehook),
      sigint=signal.getsignal(signal.SIGINT),
      frozen=gc.get_freeze_count(),
      details=(error_reports._path, error_reports._fd),  # pylint: disable=protected-access
      fd2=os.fstat(2).st_ino)


def test_a_failed_job_leaves_the_process_as_it_was(tmp_path):
  """A job that fails after its start-up (its hooks, filters and SIGINT
  handler installed, file descriptor 2 pointed at its details file)."""
  workdir = tmp_path / "a_file"
  workdir.write_text("x")
  before = _state()
  result = in_process.run_main(workdir, "--config.train.num_steps=2")
  assert result.returncode == 1
  assert result.stderr.splitlines()[-1].startswith(
      f"error: --workdir={workdir} is not a directory"), result.stderr
  assert _state() == before
  result = in_process.run_module("to_hf", "--workdir", str(tmp_path))
  assert result.returncode == 1 and "error: " in result.stderr
  assert _state() == before
  assert helpers.written_files(tmp_path) == ["a_file"]
