"""Does a checkpoint fit this run? Tree paths, shapes and finiteness.

Used before a restore (a checkpoint of another model is refused with the
parameter path, both shapes and the differing config fields, not Orbax's
"Requested shape ... not compatible") and before a save (non-finite params
are never written).
"""

from __future__ import annotations

import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils


class CheckpointMismatchError(ValueError):
  """The checkpoint holds another model or optimizer than the config."""


class CheckpointDamagedError(ValueError):
  """A committed step's files were damaged after the save (its meta cannot
  be read, its arrays cannot be read, or they differ from the checksums
  written at save)."""


def root_cause(error: BaseException) -> BaseException:
  """The innermost cause: TensorStore's own error, not Orbax's wrappers."""
  while error.__cause__ is not None and error.__cause__ is not error:
    error = error.__cause__
  return error


def first_line(error: BaseException, limit: int = 300) -> str:
  text = str(error).strip().splitlines()
  return (text[0] if text else "")[:limit]


# TensorStore's status codes for bytes that do not decode (a damaged OCDBT
# node, zarr header or JSON file). Others (UNAVAILABLE, PERMISSION_DENIED,
# RESOURCE_EXHAUSTED) are the storage's or the machine's faults: the step
# may be whole, so they are raised as they are, never read as damage.
_DAMAGE_CODES = ("DATA_LOSS", "FAILED_PRECONDITION")


def is_damage(error: BaseException) -> bool:
  """Whether reading a committed step failed because its bytes are damaged."""
  root = root_cause(error)
  if isinstance(root, (UnicodeDecodeError, json.JSONDecodeError)):
    return True
  text = first_line(root, limit=2000)
  return (any(code in text for code in _DAMAGE_CODES) or
          "in OCDBT database" in text)


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


# ------------------------------------------------------------------------------
# Checksums: damage that still decodes (overwritten bytes) is found at restore.
# ------------------------------------------------------------------------------
# A checkpoint's arrays are stored without a checksum: 16 overwritten bytes in
# a state file decode to other numbers, which train on (NaN two steps later,
# or silently wrong). `save` records, per leaf, two sums over the leaf's bits
# as 32-bit words in row-major order (plain, and weighted by 2 * index + 1),
# modulo 2^32; `restore` recomputes them over what it read. Integer sums are
# exact, so the values depend on the bits alone: not on the mesh, the device
# kind or the order of the reduction (a checkpoint written on 8 TPU chips
# verifies on 1 CPU). A changed word always changes the plain sum; two
# changes that cancel in both sums are a 2^-32 chance.
DIGEST_ALGORITHM = "bits-u32-sum-and-index-weighted-sum-v1"
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32}
_MASK = np.uint64(0xFFFFFFFF)


def _digestible(x) -> bool:
  dtype = np.dtype(getattr(x, "dtype", np.float32))
  return dtype == np.bool_ or dtype.itemsize in _WORDS


def _strides(shape) -> list[int]:
  """Row-major element strides of `shape`, modulo 2^32."""
  out, step = [], 1
  for n in reversed(shape):
    out.append(step % (1 << 32))
    step *= int(n)
  return out[::-1]


def _host_sums(block: np.ndarray, starts, shape) -> tuple[int, int]:
  """(sum, weighted sum) mod 2^32 of one block (a shard, or a whole array)
  whose element [0, 0, ...] is element `starts` of an array of `shape`.

  The weight 2 * index + 1 is affine in the coordinates, so the weighted sum
  is (2 * base + 1) * sum + 2 * sum_d stride_d * sum_p p * (the block summed
  over every other axis, at p along d): a few reductions over the block and
  no index array (uint64 sums that wrap, exact modulo 2^32)."""
  block = np.ascontiguousarray(block)
  words = (block.view(np.uint8) if block.dtype == np.bool_ else
           block.view(_WORDS[block.dtype.itemsize]))
  total = int(words.sum(dtype=np.uint64))
  strides = _strides(shape)
  base = sum(int(a) * b for a, b in zip(starts, strides))
  weighted = (2 * base + 1) * total
  for d, stride in enumerate(strides):
    others = tuple(i for i in range(words.ndim) if i != d)
    marginal = words.sum(axis=others, dtype=np.uint64)
    pos = np.arange(words.shape[d], dtype=np.uint64)
    weighted += 2 * stride * int((pos * marginal).sum(dtype=np.uint64))
  return total & 0xFFFFFFFF, weighted & 0xFFFFFFFF


def _leaf_sums_on_host(x) -> tuple[int, int]:
  """This process's part of a leaf's sums: its shards of replica 0."""
  if isinstance(x, jax.Array):
    s1 = s2 = 0
    for shard in x.addressable_shards:
      if shard.replica_id:
        continue
      starts = [sl.start or 0 for sl in shard.index]
      a, b = _host_sums(np.asarray(shard.data), starts, x.shape)
      s1, s2 = s1 + a, s2 + b
    return s1 % (1 << 32), s2 % (1 << 32)
  x = np.asarray(x)
  return _host_sums(x, [0] * x.ndim, x.shape)


def _device_words(x):
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  word = _WORDS[jnp.dtype(x.dtype).itemsize]
  w = x if x.dtype == word else jax.lax.bitcast_convert_type(x, word)
  return w.astype(jnp.uint32)


@jax.jit
def device_digest(leaves):
  """[n, 2] uint32: the sums of each leaf, reduced on its devices."""
  out = []
  for x in leaves:
    w = _device_words(x)
    index = jnp.zeros(x.shape, jnp.uint32)
    for d, stride in enumerate(_strides(x.shape)):
      index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, d) * (
          jnp.uint32(stride))
    out.append(jnp.stack([jnp.sum(w, dtype=jnp.uint32),
                          jnp.sum(w * (2 * index + 1), dtype=jnp.uint32)]))
  return jnp.stack(out) if out else jnp.zeros((0, 2), jnp.uint32)


def state_digest(tree, on_device: bool | None = None) -> dict[str, list]:
  """{leaf path: [sum, weighted sum, dtype]} of every array leaf of `tree`
  (see above). On CPU it runs on the host over each process's own shards
  (compiling nothing); on accelerators one jitted reduction on device
  (`on_device` forces either; both give the same numbers)."""
  flat = {p: x for p, x in _flat(tree).items() if _digestible(x)}
  leaves = list(flat.values())
  if on_device is None:
    on_device = bool(leaves) and all(
        isinstance(x, jax.Array) for x in leaves) and (
            jax.default_backend() != "cpu")
  dtypes = [str(np.dtype(x.dtype)) for x in leaves]
  if on_device:
    sums = np.asarray(jax.device_get(device_digest(leaves)), np.uint64)
    return {p: [int(a), int(b), t] for p, (a, b), t in zip(flat, sums, dtypes)}
  sums = np.asarray([_leaf_sums_on_host(x) for x in leaves],
                    np.uint64).reshape(-1, 2)
  if jax.process_count() > 1 and sums.size:
    # Global arrays: each process summed its shards; add the parts. Leaves
    # every process holds whole: process 0's sums alone.
    split = np.asarray([isinstance(x, jax.Array) and
                        not x.is_fully_addressable for x in leaves])
    if jax.process_index():
      sums = np.where(split[:, None], sums, 0).astype(np.uint64)
    parts = np.asarray(multihost_utils.process_allgather(
        sums.astype(np.uint32))).reshape(-1, len(flat), 2)
    sums = parts.astype(np.uint64).sum(axis=0) & _MASK
  return {p: [int(a), int(b), t] for p, (a, b), t in zip(flat, sums, dtypes)}


def digest_mismatches(tree, recorded: dict | None) -> list[str]:
  """Paths of `tree`'s leaves whose sums differ from `recorded` (a save's
  ``checksums`` meta entry). Leaves it does not list, or restored as
  another dtype than saved, are not checked; nor is a step whose meta has
  no checksums of this algorithm."""
  if not recorded or recorded.get("algorithm") != DIGEST_ALGORITHM:
    return []
  want = recorded.get("leaves", {})
  return [p for p, sums in state_digest(tree).items()
          if p in want and list(want[p])[2:] == sums[2:] and
          list(want[p]) != sums]


def check_digest(tree, recorded: dict | None, source: str) -> None:
  """CheckpointDamagedError naming the leaves whose bits changed since the
  save (`source`: 'Checkpoint step N in DIR')."""
  bad = digest_mismatches(tree, recorded)
  if bad:
    more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    raise CheckpointDamagedError(
        f"{source} is damaged: {bad[0]}{more} differ"
        f"{'s' if len(bad) == 1 else ''} from the checksums written at save "
        "(overwritten bytes in its files); use another step.")


def digest_record(tree) -> dict:
  """The ``checksums`` entry a save writes into its meta."""
  return {"algorithm": DIGEST_ALGORITHM, "leaves": state_digest(tree)}
