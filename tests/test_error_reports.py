"""error_reports.py: the hooks that keep library reports off the user's
terminal without losing them (the details file keeps every traceback)."""

import os
import sys
import threading

import pytest

from bert_jax import error_reports


@pytest.fixture
def details(monkeypatch, tmp_path):
  """This test's details file; the interpreter's hooks restored after."""
  path = tmp_path / "details.txt"
  monkeypatch.setattr(error_reports, "_path", str(path))
  monkeypatch.setattr(error_reports, "_fd", None)
  for module, name in ((threading, "excepthook"), (sys, "excepthook"),
                       (sys, "unraisablehook")):
    monkeypatch.setattr(module, name, getattr(module, name))
  yield path
  if error_reports._fd is not None:
    os.close(error_reports._fd)


def _die_in_a_thread():
  def work():
    raise ValueError("shard 3 of 8 could not be written\nmore detail")
  t = threading.Thread(target=work, name="input-thread")
  t.start()
  t.join()


def test_a_thread_that_dies_is_one_line_and_its_traceback_in_the_file(
    details, capsys):
  error_reports.install(lambda: False)
  _die_in_a_thread()
  err = capsys.readouterr().err
  assert err == ("Thread input-thread failed: ValueError: shard 3 of 8 could "
                 f"not be written (traceback in {details})\n")
  text = details.read_text()
  assert "Exception in thread input-thread:" in text and "Traceback" in text
  assert "more detail" in text


def test_verbose_leaves_thread_deaths_to_the_previous_hook(details, capsys,
                                                          monkeypatch):
  seen = []
  monkeypatch.setattr(threading, "excepthook",
                      lambda args: seen.append(str(args.exc_value)))
  error_reports.install(lambda: True)
  _die_in_a_thread()
  assert seen == ["shard 3 of 8 could not be written\nmore detail"]
  assert capsys.readouterr().err == ""
  assert not details.exists()


def test_a_closed_event_loop_goes_to_the_file_other_errors_print(
    details, monkeypatch):
  printed = []
  monkeypatch.setattr(sys, "excepthook", lambda *a: printed.append(a[1]))
  error_reports.install(lambda: False)
  closed, other = RuntimeError("Event loop is closed"), RuntimeError("other")
  for error in (closed, other):
    sys.excepthook(type(error), error, None)
  assert printed == [other]
  assert "Uncaught:\nRuntimeError: Event loop is closed" in details.read_text()
