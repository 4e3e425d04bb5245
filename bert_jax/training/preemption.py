"""Stopping a run safely: preemption notices and the non-finite policy.

``PreemptionWatcher``: a Cloud TPU VM (and most schedulers) sends SIGTERM
some seconds before it takes the machine, and a user at a terminal presses
Ctrl-C (SIGINT). The loop asks ``reached(step)`` after every step; when it
says True the loop commits a checkpoint of that step and exits 0, and the
same command resumes. A second Ctrl-C stops at once (KeyboardInterrupt:
the entry point prints one line and exits 130), keeping the checkpoints
already committed; a third, while that exit still waits for a save in
flight, exits without waiting (the save's temporary directory is removed
by the next run). The second Ctrl-C's KeyboardInterrupt is raised in
whatever Python code runs when the signal is handled; if that is a garbage
collector callback, a ``__del__`` or a weakref callback, Python reports it
to ``sys.unraisablehook`` and drops it, so the watcher's hook delivers it
again to the main thread (the press is not lost, nor counted twice).

With one process we catch SIGTERM ourselves; with several we use JAX's
preemption sync point (``multihost_utils.reached_preemption_sync_point``),
which lets every host agree on the same step to save at
(``jax.distributed.initialize`` installs the SIGTERM listener).

``NonFiniteMonitor``: ``train_step`` already drops an update whose loss or
gradient is NaN/Inf and counts it in the state. The monitor reads each
step's ``finite`` flag one step late (so the host never waits on the step it
just dispatched) and applies ``train.nonfinite_policy``: ``"skip"`` (go on,
stop after ``train.max_nonfinite_in_a_row`` consecutive skips) or ``"stop"``
(stop at the first one, naming the step).
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time

import jax
from absl import logging
from jax.experimental import multihost_utils

POLICIES = ("skip", "stop")


def _interrupt_main_soon():
  time.sleep(0.01)  # Long enough to leave the code that dropped it.
  _thread.interrupt_main(signal.SIGINT)


class PreemptionWatcher:
  """Tells the loop when to save and exit because the machine is going away."""

  def __init__(self, signals=(signal.SIGTERM, signal.SIGINT)):
    self.requested = False
    self._interrupts = 0  # Ctrl-C after the first (which asks for a save).
    self._redeliver = False  # A dropped KeyboardInterrupt is on its way again.
    self._previous = {}
    self._previous_unraisable = None
    self._multihost = jax.process_count() > 1
    if self._multihost:
      return  # JAX's coordination service listens for SIGTERM.
    if threading.current_thread() is not threading.main_thread():
      logging.warning("Trainer not on the main thread: SIGTERM will not "
                      "trigger a preemption checkpoint.")
      return
    for sig in signals:
      self._previous[sig] = signal.signal(sig, self._on_signal)
    if signal.SIGINT in self._previous:
      self._previous_unraisable = sys.unraisablehook
      sys.unraisablehook = self._on_unraisable

  def _on_signal(self, signum, frame):
    del frame
    if self._redeliver and signum == signal.SIGINT:
      self._redeliver = False
      raise KeyboardInterrupt  # The second Ctrl-C, once more.
    if self.requested and signum == signal.SIGINT:
      self._interrupts += 1
      if self._interrupts > 1:  # Third: not even the save in flight.
        os.write(2, b"error: Interrupted again: exiting without waiting for "
                 b"the checkpoint being written; the committed ones are kept."
                 b" Run the same command to resume.\n")
        os._exit(130)  # pylint: disable=protected-access
      raise KeyboardInterrupt  # Second Ctrl-C: the user does not want to wait.
    self.requested = True
    logging.warning("Received %s: finishing the current step, then saving a "
                    "checkpoint and exiting.", signal.Signals(signum).name)

  def _on_unraisable(self, info):
    """A KeyboardInterrupt of ours dropped where Python cannot raise (a gc
    callback, __del__): interrupt the main thread again, from a new thread
    a moment later (from this one the handler would run at once, still
    inside the code that drops it; `threading.Thread.start` would wait for
    the thread, and the interrupt would land here too)."""
    if self._interrupts and issubclass(info.exc_type, KeyboardInterrupt):
      self._redeliver = True
      _thread.start_new_thread(_interrupt_main_soon, ())
      return
    self._previous_unraisable(info)

  def reached(self, step: int) -> bool:
    """True when the loop should checkpoint `step` and stop (all hosts agree)."""
    if self._multihost:
      try:
        return multihost_utils.reached_preemption_sync_point(step)
      except RuntimeError as e:  # Preemption service disabled.
        logging.log_first_n(logging.WARNING,
                            "No preemption checkpoints: %s", 1, e)
        return False
    return self.requested

  def close(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}
    if self._previous_unraisable is not None:
      if sys.unraisablehook == self._on_unraisable:
        sys.unraisablehook = self._previous_unraisable
      self._previous_unraisable = None


class NonFiniteMonitor:
  """Applies train.nonfinite_policy to the per-step `finite` flags."""

  LAG = 32  # Steps a flag may wait unread between flushes.

  def __init__(self, policy: str = "skip", max_in_a_row: int = 10,
               in_a_row: int = 0, total: int = 0):
    if policy not in POLICIES:
      raise ValueError(f"train.nonfinite_policy={policy!r} is not one of "
                       f"{POLICIES}.")
    if max_in_a_row < 1:
      raise ValueError(f"train.max_nonfinite_in_a_row={max_in_a_row} must be "
                       ">= 1.")
    self.policy, self.max_in_a_row = policy, int(max_in_a_row)
    self.in_a_row, self.total = int(in_a_row), int(total)
    self.skipped_steps: list[int] = []
    self.last_checkpoint: int | None = None
    self._pending: list[tuple[int, jax.Array]] = []

  def observe(self, step: int, finite) -> None:
    """Record step `step`'s flag without reading it.

    Reading a flag waits for its step, which would stall the device queue
    every step. The trainer flushes at log and save steps (it syncs there
    anyway); in between, only flags `LAG` steps old are read, so a long
    log interval still stops a diverged run within ~2 * LAG steps. Updates
    of non-finite steps are dropped in-graph, so reading late is safe.
    """
    self._pending.append((step, finite))
    if len(self._pending) > 2 * self.LAG:
      ready, self._pending = (self._pending[:-self.LAG],
                              self._pending[-self.LAG:])
      self._check(ready)

  def flush(self) -> None:
    """Check every recorded step (before a save, at the end)."""
    ready, self._pending = self._pending, []
    self._check(ready)

  def _check(self, items) -> None:
    flags = jax.device_get([finite for _, finite in items])  # One transfer.
    for (step, _), finite in zip(items, flags):
      if bool(finite):
        self.in_a_row = 0
        continue
      self.total += 1
      self.in_a_row += 1
      self.skipped_steps.append(step)
      logging.warning("Non-finite loss or gradient at step %d: update "
                      "dropped (%d so far, %d in a row).", step, self.total,
                      self.in_a_row)
      last = ("" if self.last_checkpoint is None else
              f" The last checkpoint (step {self.last_checkpoint}) has "
              "finite weights.")
      if self.policy == "stop":
        raise FloatingPointError(
            f"Non-finite loss or gradient at step {step} "
            "(train.nonfinite_policy='stop'): stopped. The update was not "
            f"applied and nothing non-finite was checkpointed.{last} Set "
            "train.nonfinite_policy='skip' to drop such updates and go on.")
      if self.in_a_row >= self.max_in_a_row:
        first = step - self.in_a_row + 1
        raise FloatingPointError(
            f"{self.in_a_row} non-finite steps in a row (steps {first}-{step}, "
            f"train.max_nonfinite_in_a_row={self.max_in_a_row}): stopped. "
            f"Those updates were dropped and nothing non-finite was "
            f"checkpointed.{last} Lower train.learning_rate or check the "
            "data.")
