"""Orbax checkpoints you can trust: exact resume, any mesh, corruption handling.

Layout: ``WORKDIR/checkpoints/<step>/{state,data,meta}``.
- ``state``: {step, rng, params, opt_state, nonfinite counters} saved with
  StandardSave (async: the arrays are copied off the devices before
  ``save`` returns, written in a background thread), restored onto whatever
  mesh the target shardings describe (8 devices -> 2 -> 1 gives identical
  values).
- ``data``: the tf.data iterator state. Orbax runs this (synchronous) item
  inside ``save`` before it returns, so it is the iterator position of the
  same step as ``state`` (``tests/checkpoints/test_manager.py`` checks it).
- ``meta``: the config and the last logged metrics, as JSON.

Guarantees (each has a test):
- A step directory is only listed once Orbax committed it (tmp directory
  renamed / commit_success written); a save killed half-way is ignored and its
  temporary directory removed when the next run starts.
- If the newest committed step cannot be read (a truncated or missing file),
  ``restore_latest`` warns, moves it to ``WORKDIR/checkpoints_corrupt/`` and
  resumes from the previous good step.
- ``save`` refuses to write non-finite parameters or optimizer state.
- Restoring into a config whose shapes differ raises one ``ValueError`` naming
  the parameter path and both shapes (never a silent partial restore).
  Loading params alone from another run is explicit: ``restore_params``
  (``train.init_from``).

``load_params`` reads the parameters alone as numpy with no mesh and no
TensorFlow (for export and analysis).
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from bert_jax.checkpoints import checks as checkpoint_checks
from bert_jax.checkpoints import orbax_reads
from bert_jax.checkpoints.checks import CheckpointMismatchError
from bert_jax.checkpoints.reading import DATA
from bert_jax.checkpoints.reading import META
from bert_jax.checkpoints.reading import STATE
from bert_jax.checkpoints.reading import absolute
from bert_jax.checkpoints.reading import check_step_digest
from bert_jax.checkpoints.reading import checkpoint_dir
from bert_jax.checkpoints.reading import damage_on_read
from bert_jax.checkpoints.reading import read_meta
from bert_jax.checkpoints.reading import read_step_meta
from bert_jax.checkpoints.reading import stored_state_tree

CORRUPT_DIR = "checkpoints_corrupt"


class CheckpointSaveError(OSError):
  """A save failed (disk full, permissions): the message is one sentence."""


# ------------------------------------------------------------------------------
# Data iterator as an Orbax item.
# ------------------------------------------------------------------------------
class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves/restores an iterator exposing ``save(dir)``/``restore(dir)``.

  Not an AsyncCheckpointHandler on purpose: Orbax runs synchronous items to
  completion inside ``CheckpointManager.save``, before the loop advances the
  iterator again.
  """

  def save(self, directory: epath.Path, args: "DataIteratorSave"):
    directory.mkdir(parents=True, exist_ok=True)
    args.iterator.save(os.fspath(directory))

  def restore(self, directory: epath.Path, args: "DataIteratorRestore"):
    args.iterator.restore(os.fspath(directory))
    return args.iterator


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
  iterator: Any


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
  iterator: Any


# ------------------------------------------------------------------------------
# Manager.
# ------------------------------------------------------------------------------
def _options(ckpt_config):
  keep_period = int(ckpt_config.get("keep_period", 0) or 0)
  policies = [ocp.checkpoint_managers.LatestN(
      n=ckpt_config.get("max_to_keep", 3) or None)]
  if keep_period > 0:
    policies.append(ocp.checkpoint_managers.EveryNSteps(keep_period))
  return ocp.CheckpointManagerOptions(
      preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(
          policies),
      enable_async_checkpointing=bool(ckpt_config.get("async_save", True)),
      create=True,
      # Half-written saves of a killed run must not linger or block saves.
      cleanup_tmp_directories=True,
  )


class Checkpointer:
  """ocp.CheckpointManager with our three items, checks and fallbacks.

  Keeps the newest ``checkpoint.max_to_keep`` steps plus, permanently, every
  step that is a multiple of ``checkpoint.keep_period`` (0: none).
  """

  def __init__(self, workdir: str, ckpt_config: ml_collections.ConfigDict):
    self.workdir = absolute(workdir)
    self.directory = checkpoint_dir(workdir)
    self.manager = ocp.CheckpointManager(
        self.directory, options=_options(ckpt_config),
        item_handlers={STATE: ocp.StandardCheckpointHandler(),
                       DATA: DataIteratorHandler(),
                       META: ocp.JsonCheckpointHandler()})
    self._closed = False
    self._pending: int | None = None  # Step of an async save not yet checked.
    self._failed = False
    # Called before every save (workdir_lock: is the workdir still ours?).
    self.guard = None

  # ---- Queries.
  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def _step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def stored_state_tree(self, step: int):
    """The tree of ArrayMetadata (shapes, dtypes) of a step's ``state``."""
    return stored_state_tree(self._step_dir(step))

  def read_meta(self, step: int) -> dict:
    return read_meta(self.workdir, step)

  # ---- Save.
  def save(self, step: int, state, iterator=None, meta: dict | None = None,
           force: bool = False) -> bool:
    """Start an (async) save of state + iterator position + meta at `step`.

    Raises FloatingPointError, writing nothing, if params or optimizer state
    hold NaN/Inf: a non-finite checkpoint would poison every resume.
    """
    bad = checkpoint_checks.nonfinite_paths({"params": state["params"],
                           "opt_state": state["opt_state"]})
    if bad:
      raise FloatingPointError(
          f"Refusing to checkpoint step {step}: non-finite values in "
          f"{', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}. The last "
          f"good checkpoint is step {self.latest_step()}.")
    if self.guard is not None:
      self.guard()
    self.check_for_errors(wait=True)  # The previous save, before a new one.
    # Checksums of what is saved: restore verifies them (damage that still
    # decodes is set aside, not trained on).
    meta = dict(meta or {}, checksums=checkpoint_checks.digest_record(state))
    items = {STATE: ocp.args.StandardSave(state),
             META: ocp.args.JsonSave(meta)}
    if iterator is not None:
      items[DATA] = DataIteratorSave(iterator)
    try:
      saved = self.manager.save(step, args=ocp.args.Composite(**items),
                                force=force)
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(step, e) from e
    if saved:
      self._pending = step
    return saved

  def check_for_errors(self, wait: bool = False) -> None:
    """Raise CheckpointSaveError if the last async save failed.

    Cheap enough for every step: without `wait` it only looks whether the
    background save has finished (no I/O, no device sync). Orbax keeps a
    failure in its finalize thread until someone waits for it; without this
    the run would train on until the next save interval.
    """
    if self._pending is None or self._closed:
      return
    if not wait and self.manager.is_saving_in_progress():
      return
    step, self._pending = self._pending, None
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # pylint: disable=broad-except
      raise self._save_error(step, e) from e

  def _save_error(self, step: int, error: Exception) -> CheckpointSaveError:
    self._failed = True
    root = checkpoint_checks.root_cause(error)
    cause = checkpoint_checks.first_line(root, limit=2000)
    # Tensorstore: '... Failed writing: "FILE": Failed to write N bytes to
    # file 20: File too large [os_error_code=27]...' -> the file and reason.
    m = re.search(r'Failed writing: "([^"]+)": (.*?)(?: \[|$)', cause)
    cause = (f"cannot write {m.group(1)}: {m.group(2)}" if m else
             f"{type(root).__name__}: {cause[:300]}")
    older = [s for s in self.all_steps() if s < step]
    kept = (f"older checkpoints (steps {older}) are intact" if older else
            "no older checkpoint exists")
    return CheckpointSaveError(
        f"Saving checkpoint step {step} to {self._step_dir(step)} failed "
        f"({cause}); {kept}. "
        "Free space or fix the storage, then rerun the same command to "
        "resume.")

  # ---- Restore.
  def restore(self, step: int, abstract_state, iterator=None, config=None):
    """Restore `step` onto the shardings carried by `abstract_state`.

    The stored shapes are compared with `abstract_state` first: a different
    model or optimizer raises CheckpointMismatchError naming the path and
    both shapes. The iterator (if given) is restored to the same step. A
    step whose meta is unreadable, or whose arrays differ from the checksums
    written at save, raises CheckpointDamagedError.
    """
    meta = read_step_meta(self._step_dir(step))  # Damaged: raises.
    stored_config = meta.get("config")
    checkpoint_checks.check_compatible(
        self.stored_state_tree(step), abstract_state,
        source=self._step_dir(step), stored_config=stored_config,
        current_config=config,
        hint=("Use a new --workdir, or set the model fields to the ones the "
              "checkpoint was trained with; to start a new run from its "
              "weights only, set train.init_from to its workdir."))
    items = {STATE: ocp.args.StandardRestore(abstract_state)}
    if iterator is not None:
      if (epath.Path(self._step_dir(step)) / DATA).is_dir():
        items[DATA] = DataIteratorRestore(iterator)
      else:
        logging.warning("Checkpoint step %d has no data-iterator state; the "
                        "input starts from the beginning.", step)
    with orbax_reads.orbax_reads(), damage_on_read(self._step_dir(step)):
      restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    check_step_digest(restored[STATE], self._step_dir(step), meta)
    return restored[STATE]

  def restore_latest(self, abstract_state, iterator=None, config=None):
    """(state, step) from the newest readable step, or (None, None) if none.

    A step that cannot be read (truncated or missing files, an unreadable
    meta), whose arrays differ from the checksums written at save
    (overwritten bytes) or that holds non-finite params is moved to
    WORKDIR/checkpoints_corrupt/ with a warning and the previous step is
    tried. A config mismatch is raised, not skipped.
    """
    steps = self.all_steps()
    failures = []
    for step in reversed(steps):
      try:
        stored = self.stored_state_tree(step)
        del stored
      except Exception as e:  # pylint: disable=broad-except
        failures.append((step, e))
        self._quarantine(step, e)
        continue
      try:
        state = self.restore(step, abstract_state, iterator, config)
      except CheckpointMismatchError:
        raise
      except Exception as e:  # pylint: disable=broad-except
        failures.append((step, e))
        self._quarantine(step, e)
        continue
      bad = checkpoint_checks.nonfinite_paths(state["params"])
      if bad:
        e = FloatingPointError(f"non-finite params {bad[:3]}")
        failures.append((step, e))
        self._quarantine(step, e)
        continue
      if failures:
        logging.warning(
            "Resumed from step %d, the newest good checkpoint; unreadable "
            "newer step(s) %s were moved to %s.", step,
            [s for s, _ in failures], os.path.join(self.workdir, CORRUPT_DIR))
      return state, step
    if failures:
      raise ValueError(
          f"No readable checkpoint in {self.directory}: steps "
          f"{[s for s, _ in failures]} failed (moved to "
          f"{os.path.join(self.workdir, CORRUPT_DIR)}); first error: "
          f"{checkpoint_checks.first_line(failures[0][1])}")
    return None, None

  def _quarantine(self, step: int, error: Exception) -> None:
    src = epath.Path(self._step_dir(step))
    dst = epath.Path(self.workdir) / CORRUPT_DIR / f"{step}-{int(time.time())}"
    root = checkpoint_checks.root_cause(error)
    logging.warning(
        "Checkpoint step %d in %s cannot be used (%s: %s); moving it to %s "
        "and trying the previous step.", step, self.directory,
        type(root).__name__, checkpoint_checks.first_line(root), dst)
    if jax.process_index() == 0:
      try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        src.rename(dst)
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("Could not move %s (%s); deleting it.", src, e)
        self.manager.delete(step)
    _sync("bert_jax_checkpoint_quarantine")
    self.manager.reload()

  def wait(self):
    """Block until in-flight async saves are committed."""
    if not self._closed:
      self.check_for_errors(wait=True)
      self.manager.wait_until_finished()

  def close(self):
    if self._closed:
      return
    self._closed = True
    try:
      self.manager.close()
    except Exception:  # pylint: disable=broad-except
      if not self._failed:  # Already reported as CheckpointSaveError.
        raise


def _sync(name: str) -> None:
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


# ------------------------------------------------------------------------------
# Params alone: partial restore (sharded) and mesh-free numpy reading.
# ------------------------------------------------------------------------------
