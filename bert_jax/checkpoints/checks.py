"""Does a checkpoint fit this run? Tree paths, shapes and finiteness.

Used before a restore (a checkpoint of another model is refused with the
parameter path, both shapes and the differing config fields, not Orbax's
"Requested shape ... not compatible") and before a save (non-finite params
are never written).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils


class CheckpointMismatchError(ValueError):
  """The checkpoint holds another model or optimizer than the config."""


def _key_str(k) -> str:
  for attr in ("key", "name", "idx"):
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def path_str(path) -> str:
  """('params', 'bert', 0, ...) key path -> 'params/bert/0/...'.

  Orbax stores namedtuple fields and int keys as strings; this form is the
  same for the stored tree and for the live one.
  """
  return "/".join(_key_str(k) for k in path)


def _flat(tree) -> dict[str, Any]:
  leaves = jax.tree_util.tree_flatten_with_path(
      tree, is_leaf=lambda x: x is None)[0]
  return {path_str(p): v for p, v in leaves if v is not None}


def _shape(x) -> tuple:
  return tuple(getattr(x, "shape", ()) or ())


def config_differences(stored: dict | None, current) -> list[str]:
  """Model/optimizer fields that differ between a stored config and `current`."""
  if not stored or current is None:
    return []
  current = current.to_dict() if hasattr(current, "to_dict") else dict(current)
  out = []
  for group, fields in (("model", None), ("train", ("optimizer",))):
    a, b = stored.get(group, {}) or {}, current.get(group, {}) or {}
    for f in sorted(set(a) | set(b)):
      if fields is not None and f not in fields:
        continue
      if a.get(f) != b.get(f):
        out.append(f"{group}.{f}: {a.get(f)!r} in the checkpoint, "
                   f"{b.get(f)!r} in this config")
  return out


def check_compatible(stored_tree, target_tree, *, source: str,
                     stored_config: dict | None = None,
                     current_config=None, hint: str = "") -> None:
  """Raise CheckpointMismatchError naming paths and both shapes on mismatch."""
  stored, target = _flat(stored_tree), _flat(target_tree)
  problems = []
  for p, t in target.items():
    if p not in stored:
      problems.append(f"{p} (shape {_shape(t)}) is missing from the checkpoint")
    elif _shape(stored[p]) != _shape(t):
      problems.append(f"{p} has shape {_shape(stored[p])} in the checkpoint "
                      f"but {_shape(t)} in this config")
  for p in stored:
    if p not in target:
      problems.append(f"{p} (shape {_shape(stored[p])}) is in the checkpoint "
                      "but not in this config's model")
  if not problems:
    return
  # Shape mismatches first: they name the config field most directly.
  problems.sort(key=lambda s: ("has shape" not in s,
                               not s.startswith("params/")))
  msg = (f"Checkpoint {source} does not match this config: {problems[0]}")
  if len(problems) > 1:
    msg += f" (and {len(problems) - 1} more: {'; '.join(problems[1:4])}"
    msg += "; ...)" if len(problems) > 4 else ")"
  diffs = config_differences(stored_config, current_config)
  if diffs:
    msg += ". Config fields that differ: " + "; ".join(diffs)
  msg += "." + (f" {hint}" if hint else "")
  raise CheckpointMismatchError(msg)


def _all_finite(x) -> bool:
  """NaN/Inf check on this process's shards, on the host (no compile)."""
  if isinstance(x, jax.Array):
    return all(np.isfinite(np.asarray(s.data)).all()
               for s in x.addressable_shards if s.replica_id == 0)
  return bool(np.isfinite(np.asarray(x)).all())


@jax.jit
def _device_finite(leaves):
  return jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves])


def nonfinite_paths(tree) -> list[str]:
  """Paths of floating-point leaves holding NaN or Inf, on any process.

  On CPU it runs on the host over each process's own shards (compiling
  nothing); on accelerators, one jitted reduction per leaf on device.
  """
  flat = {p: x for p, x in _flat(tree).items()
          if jnp.issubdtype(getattr(x, "dtype", np.float32), jnp.inexact)}
  leaves = list(flat.values())
  if leaves and all(isinstance(x, jax.Array) for x in leaves) and (
      jax.default_backend() != "cpu"):
    # On accelerators: reduce on device, fetch one flag per leaf.
    ok = np.asarray(jax.device_get(_device_finite(leaves)), np.int32)
  else:
    ok = np.asarray([_all_finite(x) for x in leaves], np.int32)
  if jax.process_count() > 1 and ok.size:
    ok = np.asarray(multihost_utils.process_allgather(ok)).reshape(
        -1, ok.size).min(axis=0)
  return [p for p, good in zip(flat, ok) if not good]
