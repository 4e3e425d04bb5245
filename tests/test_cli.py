"""cli.py in process: what a user sees when a command line or a run fails.

Every failure is one `error: ...` line, the last one on stderr, and a
non-zero exit: a config file that is not there, a misspelled override, a
workdir on another host, an error the user can fix (exit 1), a bug (exit 1,
its traceback in the details file), Ctrl-C (exit 130); --verbose raises
instead. The subprocess runs of the same (test_cli_start, test_run_safety,
test_refusals) are in the slow tier.
"""

import os
import signal
import sys
import threading

import pytest

from bert_jax import cli
from bert_jax import error_reports
from tests import helpers

TINY = os.path.join(helpers.REPO, "configs", "tiny.py")


@pytest.fixture
def command_line(monkeypatch, tmp_path):
  """Parses a command line with cli.parse_flags; afterwards the flags are
  unparsed, file descriptor 2 (which a failure points at the details file)
  and the SIGINT handler are as before, and the details file is this
  test's."""
  monkeypatch.setattr(error_reports, "_path", str(tmp_path / "details.txt"))
  monkeypatch.setattr(error_reports, "_fd", None)
  for module, name in ((threading, "excepthook"), (sys, "excepthook"),
                       (sys, "unraisablehook")):
    monkeypatch.setattr(module, name, getattr(module, name))
  stderr = os.dup(2)
  sigint = signal.getsignal(signal.SIGINT)

  cli.define_job_flags()  # As every job does when it runs.

  def parse(*flags, workdir=str(tmp_path / "run")):
    argv = ["main", "--config", TINY, "--workdir", workdir, *flags]
    monkeypatch.setattr(sys, "argv", argv)
    return cli.parse_flags(argv)

  yield parse
  helpers.unparse_flags()
  os.dup2(stderr, 2)
  os.close(stderr)
  signal.signal(signal.SIGINT, sigint)
  if error_reports._fd is not None:
    os.close(error_reports._fd)


def _fails(capfd, job) -> tuple[int, list[str]]:
  """Runs `job`, which must exit; returns (exit status, its stderr lines)."""
  with pytest.raises(SystemExit) as e:
    job()
  return e.value.code, capfd.readouterr().err.splitlines()


def test_an_error_the_user_can_fix_is_one_last_line_and_exit_1(
    command_line, capfd, tmp_path):
  command_line()

  def job():
    raise ValueError("data.seq_length=600 exceeds 512.")
  code, lines = _fails(capfd, lambda: cli.call(job))
  assert code == 1
  assert lines[-1] == "error: data.seq_length=600 exceeds 512."
  # Whatever a library writes to stderr later goes to the details file.
  os.write(2, b"a late library report\n")
  assert capfd.readouterr().err == ""
  assert "a late library report" in (tmp_path / "details.txt").read_text()


def test_a_bug_is_one_line_naming_the_file_with_its_traceback(command_line,
                                                             capfd, tmp_path):
  command_line()

  def job():
    raise KeyError("params")
  code, lines = _fails(capfd, lambda: cli.call(job))
  details = str(tmp_path / "details.txt")
  assert code == 1
  assert lines[-1] == (f"error: KeyError: 'params' (traceback in {details}; "
                       "rerun with --verbose to print it)")
  text = (tmp_path / "details.txt").read_text()
  assert "Traceback" in text and 'raise KeyError("params")' in text


def test_verbose_raises_instead(command_line):
  command_line("--verbose")

  def job():
    raise ValueError("bad value")
  with pytest.raises(ValueError, match="bad value"):
    cli.call(job)


def test_ctrl_c_is_one_line_naming_the_newest_checkpoint_and_exit_130(
    command_line, capfd, tmp_path):
  workdir = tmp_path / "run"
  (workdir / "checkpoints" / "7" / "state").mkdir(parents=True)
  command_line(workdir=str(workdir))

  def job():
    raise KeyboardInterrupt
  code, lines = _fails(capfd, lambda: cli.call(job))
  assert code == cli.INTERRUPTED_EXIT == 130
  assert lines[-1] == (
      "error: Interrupted (Ctrl-C): stopped at once, without saving; the "
      "newest checkpoint is step 7. Run the same command to resume.")


@pytest.mark.parametrize("flags, workdir, expected", [
    (("--config", "configs/none.py"), "/tmp/x",
     "error: --config file configs/none.py does not exist; pass a config "
     "file such as configs/tiny.py."),
    (("--config", TINY, "--config.train.num_stepz=3"), "/tmp/x",
     "error: --config.train.num_stepz: the config has no field 'num_stepz'; "
     "did you mean 'num_steps'? Fields are listed in bert_jax/config_lib.py."),
    (("--config", TINY), "file://otherhost/runs/a",
     "error: --workdir: file://otherhost/runs/a names a path on host "
     "'otherhost': a file:// URL is a path on this machine (file:///dir); "
     "use the directory itself, a shared mount or gs://."),
], ids=["missing_config", "misspelled_override", "workdir_on_another_host"])
def test_bad_command_line_is_one_line_and_exit_1(monkeypatch, capfd, flags,
                                                 workdir, expected):
  argv = ["main", *flags, "--workdir", workdir]
  monkeypatch.setattr(sys, "argv", argv)
  try:
    code, lines = _fails(capfd, lambda: cli.parse_flags(argv))
  finally:
    helpers.unparse_flags()
  assert code == 1
  assert lines == [expected]


@pytest.mark.parametrize("flag, env, expected", [
    ("auto", {}, False),
    ("auto", {"TPU_WORKER_HOSTNAMES": "localhost"}, False),
    ("auto", {"TPU_WORKER_HOSTNAMES": "host-0,host-1"}, True),
    ("auto", {"SLURM_NTASKS": "4"}, True),
    ("auto", {"OMPI_COMM_WORLD_SIZE": "1"}, False),
    ("off", {"SLURM_NTASKS": "4"}, False),
    ("on", {}, True),
])
def test_distributed_start_follows_the_flag_and_the_launcher(
    command_line, monkeypatch, flag, env, expected):
  for name in cli._MULTIHOST_ENV:
    monkeypatch.delenv(name, raising=False)
  for name, value in env.items():
    monkeypatch.setenv(name, value)
  command_line(f"--distributed={flag}")
  assert cli.wants_distributed() is expected
