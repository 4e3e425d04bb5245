"""training/preemption.py's signal handling in process: SIGTERM or a first
Ctrl-C asks for a checkpoint at the end of the step, a second Ctrl-C stops
at once, and the handlers are handed back. (The runs that are killed,
interrupted and resumed are in the slow tier.)"""

import gc
import signal
import sys
import threading
import time

import pytest

from bert_jax.training import preemption


@pytest.fixture
def watcher():
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  unraisable = sys.unraisablehook
  w = preemption.PreemptionWatcher()
  yield w
  w.close()
  for s, handler in handlers.items():
    assert signal.getsignal(s) is handler  # close() handed them back.
  assert sys.unraisablehook is unraisable


def test_sigterm_asks_for_a_checkpoint_at_the_end_of_the_step(watcher,
                                                              caplog):
  assert not watcher.reached(3)
  with caplog.at_level("WARNING"):
    signal.raise_signal(signal.SIGTERM)
  assert watcher.reached(3) and watcher.reached(4)
  assert ("Received SIGTERM: finishing the current step, then saving a "
          "checkpoint and exiting.") in caplog.text


def test_a_second_ctrl_c_stops_at_once(watcher):
  signal.raise_signal(signal.SIGINT)  # The first asks for a save...
  assert watcher.reached(7)
  with pytest.raises(KeyboardInterrupt):  # ...the second does not wait.
    signal.raise_signal(signal.SIGINT)


def test_a_second_ctrl_c_dropped_by_a_gc_callback_still_stops(watcher):
  """Python drops an exception raised in a gc callback (jax registers one)
  or a __del__: the watcher delivers the second Ctrl-C again, and counts it
  once (a third press would exit the process at once)."""
  signal.raise_signal(signal.SIGINT)  # The first asks for a save...

  def press_during_gc(phase, info):
    del info
    if phase == "start":
      gc.callbacks.remove(press_during_gc)
      signal.raise_signal(signal.SIGINT)  # ...the second lands in a callback.

  gc.callbacks.insert(0, press_during_gc)
  stopped = False
  try:
    gc.collect()
    deadline = time.time() + 10
    while time.time() < deadline:
      time.sleep(0.01)
  except KeyboardInterrupt:
    stopped = True
  finally:
    if press_during_gc in gc.callbacks:
      gc.callbacks.remove(press_during_gc)
  assert stopped and watcher.reached(8)


def test_other_unraisable_errors_go_to_the_previous_hook(watcher,
                                                         monkeypatch):
  seen = []
  monkeypatch.setattr(watcher, "_previous_unraisable", seen.append)

  class Broken:
    def __del__(self):
      raise ValueError("from __del__")

  Broken()
  assert [type(r.exc_value) for r in seen] == [ValueError]


def test_off_the_main_thread_no_handler_is_installed(caplog):
  before = signal.getsignal(signal.SIGTERM)
  made = []
  with caplog.at_level("WARNING"):
    t = threading.Thread(target=lambda: made.append(
        preemption.PreemptionWatcher()))
    t.start()
    t.join()
  assert signal.getsignal(signal.SIGTERM) is before
  assert not made[0].reached(1)
  assert ("Trainer not on the main thread: SIGTERM will not trigger a "
          "preemption checkpoint.") in caplog.text
