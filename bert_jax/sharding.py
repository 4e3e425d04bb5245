"""Device mesh, logical-axis rules and the shardings of state and batch.

The mesh has axes ("data", "fsdp", "tensor"). We build it with
``AxisType.Auto`` on every axis (GSPMD style): parameters and activations are
placed by logical names mapped through ``config.mesh.rules`` and XLA
propagates the rest. (``jax.make_mesh`` defaults to Explicit axes in jax
0.10, where ``table[ids]`` on a sharded table raises; see stack-notes.)
"""

from __future__ import annotations

import contextlib
import math

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec


MESH_AXES = ("data", "fsdp", "tensor")
# The batch dimension is split over every axis that holds data replicas.
BATCH_AXES = ("data", "fsdp")


def mesh_shape(mesh_config: ml_collections.ConfigDict,
               num_devices: int) -> tuple[int, int, int]:
  """Resolve -1 in config.mesh to the remaining devices; validate the product."""
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one of data/fsdp/tensor may be -1, "
                     f"got data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]}.")
  for axis, size in zip(MESH_AXES, sizes):
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{axis}={size} must be a positive int or -1.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(
          f"config.mesh: {num_devices} devices are not divisible by the fixed "
          f"axes (product {known}); data={sizes[0]} fsdp={sizes[1]} "
          f"tensor={sizes[2]}.")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(
        f"config.mesh: data*fsdp*tensor = {math.prod(sizes)} but there are "
        f"{num_devices} devices (data={sizes[0]} fsdp={sizes[1]} "
        f"tensor={sizes[2]}); use -1 on one axis to take the rest.")
  return tuple(sizes)


def make_mesh(mesh_config: ml_collections.ConfigDict,
              devices=None) -> jax.sharding.Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(mesh_config, len(devices))
  return jax.make_mesh(
      shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * 3,
      devices=devices)


def rules(mesh_config: ml_collections.ConfigDict):
  """The logical-axis rules table from config as a tuple of (name, axes)."""
  out = []
  for name, axes in mesh_config.rules:
    out.append((name, tuple(axes) if isinstance(axes, list) else axes))
  return tuple(out)


@contextlib.contextmanager
def logical_context(mesh, rule_table):
  """Mesh + rules in scope: model-code `logical.constrain` calls take effect."""
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rule_table):
    yield


def data_parallel_size(mesh) -> int:
  return math.prod(mesh.shape[a] for a in BATCH_AXES)


def batch_sharding(mesh) -> NamedSharding:
  """Leading (batch) dimension over data and fsdp; the rest replicated."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def param_shardings(abstract_state: nnx.State, mesh, rule_table) -> dict:
  """Pure dict of NamedShardings for a State of Params, from logical names.

  A dimension whose size the mesh axes do not divide is left replicated
  (e.g. the 2-row segment table under fsdp=4) rather than failing.
  """
  with nnx.logical_axis_rules(rule_table):
    specs = nnx.get_partition_spec(abstract_state).to_pure_dict()
  shapes = abstract_state.to_pure_dict()

  def fit(spec, leaf):
    dims = []
    for dim, axes in zip(leaf.shape, tuple(spec) + (None,) * (
        len(leaf.shape) - len(spec))):
      names = (axes,) if isinstance(axes, str) else (axes or ())
      size = math.prod(mesh.shape[n] for n in names)
      dims.append(axes if axes is not None and dim % size == 0 else None)
    return NamedSharding(mesh, PartitionSpec(*dims))

  return jax.tree.map(fit, specs, shapes,
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def opt_state_shardings(tx, abstract_opt_state, params_sharding, mesh):
  """Optimizer moments follow their parameter's sharding; counts replicate."""
  return optax.tree_map_params(
      tx, lambda _, s: s, abstract_opt_state, params_sharding,
      transform_non_params=lambda _: replicated(mesh))


def describe(mesh) -> str:
  return " x ".join(f"{a}={mesh.shape[a]}" for a in mesh.axis_names)


def global_batch(local_batch: dict, sharding: NamedSharding) -> dict:
  """Per-host numpy batch -> global jax.Arrays sharded over the batch axes."""
  return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v))
          for k, v in local_batch.items()}
