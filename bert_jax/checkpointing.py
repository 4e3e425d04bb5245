"""Orbax checkpoints: train state, data-iterator state and a JSON of metadata.

Layout: ``WORKDIR/checkpoints/<step>/{state,data,meta}``.
- ``state``: {step, rng, params, opt_state, ...} saved with StandardSave
  (async), restored onto whatever mesh the target shardings describe.
- ``data``: each process's tf.data iterator state (``process_<i>``), written
  synchronously at the moment of the save so it matches the state exactly.
- ``meta``: the config and the last logged metrics, as JSON.

``load_params`` reads the parameters alone as numpy with no mesh and no
TensorFlow (for export and analysis).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

STATE, DATA, META = "state", "data", "meta"


# ------------------------------------------------------------------------------
# Data iterator as an Orbax item.
# ------------------------------------------------------------------------------
class DataIteratorHandler(ocp.CheckpointHandler):
  """Saves/restores an iterator exposing ``save(dir)``/``restore(dir)``."""

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
def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), "checkpoints")


class Checkpointer:
  """Thin wrapper over ocp.CheckpointManager with our three items."""

  def __init__(self, workdir: str, ckpt_config: ml_collections.ConfigDict):
    options = ocp.CheckpointManagerOptions(
        max_to_keep=ckpt_config.max_to_keep,
        enable_async_checkpointing=ckpt_config.get("async_save", True),
        create=True,
    )
    self.manager = ocp.CheckpointManager(
        checkpoint_dir(workdir), options=options,
        item_names=(STATE, DATA, META))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, iterator=None, meta: dict | None = None,
           force: bool = False) -> bool:
    items = {STATE: ocp.args.StandardSave(state),
             META: ocp.args.JsonSave(meta or {})}
    if iterator is not None:
      items[DATA] = DataIteratorSave(iterator)
    return self.manager.save(step, args=ocp.args.Composite(**items),
                             force=force)

  def restore(self, step: int, abstract_state, iterator=None):
    """Restore state onto the shardings carried by `abstract_state`."""
    items = {STATE: ocp.args.StandardRestore(abstract_state)}
    if iterator is not None:
      items[DATA] = DataIteratorRestore(iterator)
    restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    return restored[STATE]

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.close()


# ------------------------------------------------------------------------------
# Mesh-free reading for export and analysis.
# ------------------------------------------------------------------------------
def _int_keys(tree):
  """Orbax stores dict keys as strings; layer indices come back as ints."""
  if isinstance(tree, dict):
    return {(int(k) if isinstance(k, str) and k.isdigit() else k): _int_keys(v)
            for k, v in tree.items()}
  return tree


def load_params(workdir: str, step: int | None = None):
  """Parameters as a nested dict of float32 numpy arrays, plus the config.

  Needs no mesh and no TensorFlow; works for any number of devices the run
  used. Returns (params, config, step).
  """
  directory = checkpoint_dir(workdir)
  if not os.path.isdir(directory):
    raise FileNotFoundError(f"No checkpoints under {directory}.")
  with ocp.CheckpointManager(directory, item_names=(STATE, DATA, META)) as mgr:
    step = mgr.latest_step() if step is None else step
    if step is None or step not in mgr.all_steps():
      raise FileNotFoundError(
          f"No checkpoint step {step} under {directory}; available: "
          f"{list(mgr.all_steps())}.")
    meta = mgr.restore(step, args=ocp.args.Composite(
        **{META: ocp.args.JsonRestore()}))[META]
    # Restore the params subtree only, onto host memory (numpy).
    metadata = mgr.item_metadata(step)[STATE]
    tree = metadata.tree if hasattr(metadata, "tree") else metadata
    target = jax.tree.map(
        lambda m: ocp.RestoreArgs(restore_type=np.ndarray),
        tree["params"])
    ckptr = ocp.PyTreeCheckpointer()
    restored = ckptr.restore(
        os.path.join(directory, str(step), STATE),
        args=ocp.args.PyTreeRestore(
            item={"params": tree["params"]},
            restore_args={"params": target},
            partial_restore=True))
  params = jax.tree.map(lambda x: np.asarray(x, np.float32),
                        _int_keys(restored["params"]))
  config = ml_collections.ConfigDict(meta.get("config", {}))
  return params, config, step


def read_meta(workdir: str, step: int) -> dict:
  path = os.path.join(checkpoint_dir(workdir), str(step), META, "metadata")
  with open(path) as f:
    return json.load(f)


def describe_mismatch(abstract_state, error: Exception) -> str:
  """Turn Orbax's shape/structure errors into one sentence for the user."""
  del abstract_state
  return (f"The checkpoint does not match this config's model: {error}. "
          "Start a new --workdir, or set the model fields to the ones the "
          "checkpoint was trained with.")
