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
from jax.experimental import mesh_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
# The batch dimension is split over every axis that holds data replicas.
BATCH_AXES = ("data", "fsdp")


DCN_AXES = tuple(f"dcn_{a}" for a in MESH_AXES)


def _slice_count(mesh_config) -> tuple[int, int, int]:
  """Per-axis number of slices (multi-slice / DCN); all 1 on one slice."""
  sizes = tuple(int(mesh_config[a]) for a in DCN_AXES)
  for axis, size in zip(DCN_AXES, sizes):
    if size < 1:
      raise ValueError(f"config.mesh.{axis}={size} must be a positive int "
                       "(the number of slices along that axis).")
  return sizes


def _per_slice_shape(mesh_config, devices_per_slice: int) -> list[int]:
  sizes = [int(mesh_config[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"config.mesh: at most one of data/fsdp/tensor may be -1, "
                     f"got data={sizes[0]} fsdp={sizes[1]} tensor={sizes[2]}.")
  for axis, size in zip(MESH_AXES, sizes):
    if size == 0 or size < -1:
      raise ValueError(f"config.mesh.{axis}={size} must be a positive int or -1.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if devices_per_slice % known:
      raise ValueError(
          f"config.mesh: {devices_per_slice} devices (per slice) are not "
          f"divisible by the fixed axes (product {known}); data={sizes[0]} "
          f"fsdp={sizes[1]} tensor={sizes[2]}.")
    sizes[sizes.index(-1)] = devices_per_slice // known
  if math.prod(sizes) != devices_per_slice:
    raise ValueError(
        f"config.mesh: data*fsdp*tensor = {math.prod(sizes)} but there are "
        f"{devices_per_slice} devices (per slice) (data={sizes[0]} "
        f"fsdp={sizes[1]} tensor={sizes[2]}); use -1 on one axis to take the "
        "rest.")
  return sizes


def mesh_shapes(mesh_config: ml_collections.ConfigDict, num_devices: int
                ) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """(per-slice shape, slice-count shape) over (data, fsdp, tensor).

  ``config.mesh.{data,fsdp,tensor}`` lay out the devices of one slice (fast
  ICI links; one may be -1 for the rest); ``config.mesh.dcn_{data,fsdp,
  tensor}`` say how many slices (or, with no slices, processes) sit along
  each axis over the slow data-center network. Mesh axis size = product.
  """
  dcn = _slice_count(mesh_config)
  slices = math.prod(dcn)
  if num_devices % slices:
    raise ValueError(
        f"config.mesh: {num_devices} devices cannot be split into "
        f"dcn_data*dcn_fsdp*dcn_tensor = {slices} slices.")
  ici = _per_slice_shape(mesh_config, num_devices // slices)
  return tuple(ici), dcn


def mesh_shape(mesh_config: ml_collections.ConfigDict,
               num_devices: int) -> tuple[int, int, int]:
  """Mesh axis sizes (data, fsdp, tensor): -1 resolved, slices included."""
  ici, dcn = mesh_shapes(mesh_config, num_devices)
  return tuple(i * d for i, d in zip(ici, dcn))


def make_mesh(mesh_config: ml_collections.ConfigDict,
              devices=None) -> jax.sharding.Mesh:
  """The (data, fsdp, tensor) mesh with Auto axes (see the module docstring).

  On one slice: ``jax.make_mesh``. With ``dcn_*`` > 1: a hybrid mesh whose
  slow (DCN) dimension is the outer part of each axis, grouping devices by
  TPU slice, or by process where devices have no slice (GPU hosts, CPU).
  """
  devices = jax.devices() if devices is None else list(devices)
  ici, dcn = mesh_shapes(mesh_config, len(devices))
  axis_types = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
  if math.prod(dcn) == 1:
    return jax.make_mesh(ici, MESH_AXES, axis_types=axis_types,
                         devices=devices)
  slices = {getattr(d, "slice_index", None) for d in devices}
  by_process = None in slices or len(slices) != math.prod(dcn)
  try:
    grid = mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices, process_is_granule=by_process,
        allow_split_physical_axes=True)
  except (ValueError, AssertionError) as e:
    granule = "processes" if by_process else "slices"
    raise ValueError(
        f"config.mesh: cannot lay out {len(devices)} devices as {ici} per "
        f"slice x {dcn} {granule} (dcn_data, dcn_fsdp, dcn_tensor): {e}"
    ) from e
  return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


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
