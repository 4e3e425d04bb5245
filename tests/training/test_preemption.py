"""training/preemption.py's signal handling in process: SIGTERM or a first
Ctrl-C asks for a checkpoint at the end of the step, a second Ctrl-C stops
at once, and the handlers are handed back. (The runs that are killed,
interrupted and resumed are in the slow tier.)"""

import signal
import threading

import pytest

from bert_jax.training import preemption


@pytest.fixture
def watcher():
  handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
  w = preemption.PreemptionWatcher()
  yield w
  w.close()
  for s, handler in handlers.items():
    assert signal.getsignal(s) is handler  # close() handed them back.


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
