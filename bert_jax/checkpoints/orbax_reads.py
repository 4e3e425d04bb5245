"""Orbax reads that leave no task behind (``with orbax_reads(): restore``).

Orbax runs each read in a fresh event loop (``run_until_complete``, then
``close``). When one array read fails, the outer ``gather`` raises at once and
Orbax closes the loop with the other reads' tasks still pending and the
callbacks that would retrieve their results still queued. Left so, the
garbage collector finalizes them whenever it next runs (during training, or
at exit), and each prints a traceback: a pending
``_read_array_index_and_device_put`` coroutine raises when closed ('Exception
ignored in: <coroutine ...>', sys.unraisablehook); a task or ``gather`` whose
read failed after the first one logs 'Task exception was never retrieved' or
'_GatheringFuture exception was never retrieved' (the ``asyncio`` logger, with
the read's traceback and TensorStore spec). What is left depends on how far
the other reads have got when the first fails, i.e. on CPU load, so a
damaged checkpoint's warning comes with tracebacks in some runs and not in
others. Finished inside the restore call, nothing outlives it: its one error
is the restore's.
"""

from __future__ import annotations

import asyncio
import contextlib


def _finish_tasks(loop: asyncio.AbstractEventLoop) -> None:
  """Cancel and await the tasks `loop` still holds, as ``asyncio.run`` does."""
  for _ in range(8):  # A cancelled task may start others; rarely more rounds.
    pending = asyncio.all_tasks(loop)
    for task in pending:
      task.cancel()
    # Also runs the callbacks already queued: each task's wakeup and each
    # gather's, which retrieve the results and exceptions of those done.
    loop.run_until_complete(_settle(pending))
    if not pending:
      break
  loop.run_until_complete(loop.shutdown_asyncgens())


async def _settle(tasks) -> None:
  if tasks:
    await asyncio.gather(*tasks, return_exceptions=True)


def _running_loop() -> asyncio.AbstractEventLoop | None:
  """The loop running in this thread (another loop cannot run inside it)."""
  try:
    return asyncio.get_running_loop()
  except RuntimeError:
    return None


class _LoopsFinishTheirTasks(asyncio.AbstractEventLoopPolicy):
  """The current event-loop policy, except that its new loops run
  ``_finish_tasks`` when closed (everything else is delegated)."""

  def __init__(self, inner: asyncio.AbstractEventLoopPolicy):
    self.inner = inner

  def get_event_loop(self):
    return self.inner.get_event_loop()

  def set_event_loop(self, loop):
    self.inner.set_event_loop(loop)

  def new_event_loop(self):
    loop = self.inner.new_event_loop()
    close = loop.close

    def close_after_tasks():
      try:
        if not (loop.is_closed() or loop.is_running() or _running_loop()):
          _finish_tasks(loop)
      finally:
        close()

    loop.close = close_after_tasks
    return loop

  def get_child_watcher(self):
    return self.inner.get_child_watcher()

  def set_child_watcher(self, watcher):
    self.inner.set_child_watcher(watcher)


@contextlib.contextmanager
def orbax_reads():
  """Around an Orbax restore or metadata read: the event loops it creates
  (one per ``run_sync``) finish their tasks before they close."""
  policy = asyncio.get_event_loop_policy()
  if isinstance(policy, _LoopsFinishTheirTasks):  # Nested.
    yield
    return
  asyncio.set_event_loop_policy(_LoopsFinishTheirTasks(policy))
  try:
    yield
  finally:
    asyncio.set_event_loop_policy(policy)
