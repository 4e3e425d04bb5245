"""Reading committed checkpoints without a Checkpointer (no mesh needed).

Which steps a workdir has committed, a step's stored config and metadata,
its params as numpy (export, analysis) or placed onto given shardings
(``train.init_from``, fine-tuning). ``checkpoints/manager.py`` writes them.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from bert_jax.checkpoints import checks as checkpoint_checks
from bert_jax.checkpoints import orbax_reads

STATE, DATA, META = "state", "data", "meta"
ITEMS = (STATE, DATA, META)


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(absolute(workdir), "checkpoints")


def absolute(path: str) -> str:
  """Absolute local path (``file://`` URLs too); URLs (gs://...) unchanged."""
  path = local_path(os.fspath(path))
  return path.rstrip("/") if "://" in path else os.path.abspath(path)


def local_path(path: str) -> str:
  """``file:///dir`` (or ``file://localhost/dir``) -> ``/dir``; anything else
  unchanged.

  TensorFlow reads file:// URLs but Orbax's paths (etils.epath) know only
  object stores, so a file:// workdir is taken for the local directory it
  names, once, where a path comes in. ValueError for a file:// URL naming
  another host (a path there cannot be written from here).
  """
  if not path.startswith("file://"):
    return path
  host, _, rest = path[len("file://"):].partition("/")
  if host not in ("", "localhost"):
    raise ValueError(
        f"{path} names a path on host {host!r}: a file:// URL is a path on "
        "this machine (file:///dir); use the directory itself, a shared "
        "mount or gs://.")
  return "/" + rest


def committed_steps(path: str) -> list[int]:
  """Sorted steps saved in a workdir (or its checkpoints/ directory).

  Committed steps only: an interrupted save is a "<step>.orbax-checkpoint-
  tmp-<time>" directory (or, on object stores, lacks commit_success.txt).
  """
  path = absolute(path)
  directory = (path if os.path.basename(path) == "checkpoints"
               else checkpoint_dir(path))
  if not epath.Path(directory).is_dir():
    raise FileNotFoundError(f"No checkpoints under {directory}.")
  local = "://" not in directory
  return sorted(
      int(d.name) for d in epath.Path(directory).iterdir()
      if d.name.isdigit() and (d / STATE).is_dir() and
      (local or (d / "commit_success.txt").exists()))


def resolve_step_dir(path: str, step: int | None = None) -> tuple[str, int]:
  """A workdir, its checkpoints/ dir, or one step dir -> (step dir, step)."""
  path = absolute(path)
  base = os.path.basename(path)
  if base.isdigit() and (epath.Path(path) / STATE).is_dir():
    if step is not None and step != int(base):
      raise ValueError(f"{path} is step {base}, not step {step}.")
    return path, int(base)
  directory = path if base == "checkpoints" else checkpoint_dir(path)
  steps = committed_steps(path)
  chosen = steps[-1] if (step is None and steps) else step
  if chosen is None or chosen not in steps:
    raise FileNotFoundError(
        f"No checkpoint step {step} under {directory}; available: {steps}.")
  return os.path.join(directory, str(chosen)), chosen


def _read_json(path: str) -> dict:
  return json.loads(epath.Path(path).read_text())


def _restore_params(step_dir: str, item, restore_args,
                    key: str = "params") -> Any:
  """Restore the `key` subtree of a step's state (the params, or their
  moving average "ema") with given RestoreArgs."""
  with (orbax_reads.orbax_reads(), damage_on_read(step_dir),
        ocp.PyTreeCheckpointer() as ckptr):
    restored = ckptr.restore(
        os.path.join(step_dir, STATE),
        args=ocp.args.PyTreeRestore(
            item={key: item}, restore_args={key: restore_args},
            partial_restore=True))
  return restored[key]


def stored_state_tree(step_dir: str):
  """Shapes and dtypes of a step's ``state`` item, read from its metadata."""
  # The handler, not a PyTreeCheckpointer: a Checkpointer also looks for the
  # step-level _CHECKPOINT_METADATA inside the item directory, where the
  # CheckpointManager never writes it (it is one level up), and warns that it
  # does not exist on every resume and every fill_mask.
  with orbax_reads.orbax_reads(), damage_on_read(step_dir):
    md = ocp.PyTreeCheckpointHandler().metadata(
        epath.Path(os.path.join(step_dir, STATE)))
  tree = md.item_metadata if hasattr(md, "item_metadata") else md
  tree = tree.tree if hasattr(tree, "tree") else tree
  if not tree:
    raise FileNotFoundError(f"{step_dir}/{STATE} has no readable metadata.")
  return tree


def stored_params_tree(step_dir: str):
  return stored_state_tree(step_dir)["params"]


def _describe_step(step_dir: str) -> str:
  step_dir = os.fspath(step_dir).rstrip("/")
  return (f"Checkpoint step {os.path.basename(step_dir)} in "
          f"{os.path.dirname(step_dir)}")


@contextlib.contextmanager
def damage_on_read(step_dir: str):
  """Reads of a committed step's arrays: a failure whose cause is damaged
  bytes (checks.is_damage) is CheckpointDamagedError naming the step, so
  resume sets the step aside and export refuses it as damaged; any other
  failure (the storage unreachable) is raised as it is."""
  try:
    yield
  except checkpoint_checks.CheckpointDamagedError:
    raise
  except Exception as e:  # pylint: disable=broad-except
    if not checkpoint_checks.is_damage(e):
      raise
    root = checkpoint_checks.root_cause(e)
    raise checkpoint_checks.CheckpointDamagedError(
        f"{_describe_step(step_dir)} is damaged: its files cannot be read "
        f"({type(root).__name__}: {checkpoint_checks.first_line(root)})"
    ) from e


def read_step_meta(step_dir: str) -> dict:
  """A step's meta (config, last metrics, checksums of its state).

  Every save writes one; a missing or truncated one is damage, raised as
  CheckpointDamagedError (the trainer sets the step aside, exporters refuse
  it), never read as "no config".
  """
  path = os.path.join(step_dir, META, "metadata")
  try:
    meta = _read_json(path)
    if not isinstance(meta, dict):
      raise ValueError(f"a JSON {type(meta).__name__}, not an object")
  except (OSError, ValueError) as e:
    raise checkpoint_checks.CheckpointDamagedError(
        f"{_describe_step(step_dir)} is damaged: its meta ({path}: config, "
        f"metrics, checksums) is unreadable ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else ''}); use another step."
    ) from None
  return meta


def stored_config(step_dir: str) -> dict | None:
  """The run config saved with a step (CheckpointDamagedError when its meta
  is unreadable)."""
  return read_step_meta(step_dir).get("config")


def check_step_digest(tree, step_dir: str, meta: dict | None = None) -> None:
  """CheckpointDamagedError if `tree` (a restored state, or {"params": ...})
  differs from the checksums written when the step was saved."""
  meta = read_step_meta(step_dir) if meta is None else meta
  checkpoint_checks.check_digest(tree, meta.get("checksums"),
                                 _describe_step(step_dir))


def _to_orbax_keys(tree):
  """Int dict keys -> str, as Orbax stores them (for restore targets)."""
  if isinstance(tree, dict):
    return {str(k): _to_orbax_keys(v) for k, v in tree.items()}
  return tree


def _int_keys(tree):
  """Orbax stores dict keys as strings; layer indices come back as ints."""
  if isinstance(tree, dict):
    return {(int(k) if isinstance(k, str) and k.isdigit() else k): _int_keys(v)
            for k, v in tree.items()}
  return tree


def restore_params(path: str, abstract_params, *, step: int | None = None,
                   config=None):
  """Params alone from another run's checkpoint, onto `abstract_params`' mesh.

  `path`: a workdir, its ``checkpoints/`` directory or one step directory.
  `abstract_params`: ShapeDtypeStructs with shardings (our pure-dict layout).
  Shapes must match (CheckpointMismatchError otherwise). Used for
  ``train.init_from``: a new run from pretrained weights with a fresh
  optimizer, step 0 and fresh data order.
  """
  step_dir, step = resolve_step_dir(path, step)
  checkpoint_checks.check_compatible(
      {"params": stored_params_tree(step_dir)}, {"params": abstract_params},
      source=step_dir, stored_config=stored_config(step_dir),
      current_config=config,
      hint="train.init_from needs the same model architecture.")
  target = _to_orbax_keys(abstract_params)
  restore_args = jax.tree.map(
      lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape,
                                     dtype=a.dtype), target)
  restored = _restore_params(step_dir, target, restore_args)
  check_step_digest({"params": restored}, step_dir)
  logging.info("Initialized params from %s (step %d).", step_dir, step)
  return _int_keys(restored), step


def place_params(params, abstract_params, *, source: str = "params"):
  """Host (numpy) params -> global arrays on `abstract_params`' shardings.

  Leaves are matched by path (int or str layer keys alike); shapes are
  checked first (CheckpointMismatchError naming path and shapes).
  """
  checkpoint_checks.check_compatible({"params": params}, {"params": abstract_params},
                   source=source)
  flat = checkpoint_checks._flat(params)

  def put(path, a):
    x = np.asarray(flat[checkpoint_checks.path_str(path)], a.dtype)
    return jax.make_array_from_callback(a.shape, a.sharding,
                                        lambda idx: x[idx])

  return jax.tree_util.tree_map_with_path(put, abstract_params)


def load_params(workdir: str, step: int | None = None, key: str = "params"):
  """Parameters as a nested dict of float32 numpy arrays, plus the config.

  Needs no mesh, no devices matching the run and no TensorFlow: a checkpoint
  written on 8 TPU chips loads on a laptop. `workdir` may also be a
  ``checkpoints/`` or step directory. Returns (params, config, step), layer
  indices as int keys (the layout of ``nnx.state(model).to_pure_dict()``).
  `key` "ema": the params' moving average a run with train.ema_decay keeps
  (ValueError naming the step when it kept none).
  """
  step_dir, step = resolve_step_dir(workdir, step)
  meta = read_step_meta(step_dir)
  stored_state = stored_state_tree(step_dir)
  if key not in stored_state:
    raise ValueError(f"{_describe_step(step_dir)} holds no {key!r} (its run "
                   f"kept {sorted(stored_state)}).")
  stored = stored_state[key]
  restore_args = jax.tree.map(
      lambda m: ocp.RestoreArgs(restore_type=np.ndarray), stored)
  restored = _restore_params(step_dir, stored, restore_args, key)
  check_step_digest({key: restored}, step_dir, meta)
  params = jax.tree.map(lambda x: np.asarray(x, np.float32),
                        _int_keys(restored))
  config = ml_collections.ConfigDict(meta.get("config") or {})
  return params, config, step


def read_meta(workdir: str, step: int) -> dict:
  return _read_json(os.path.join(checkpoint_dir(workdir), str(step), META,
                                 "metadata"))
