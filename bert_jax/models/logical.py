"""Logical-axis sharding constraints for activations.

Model code names activation axes ("activation_batch", "activation_embed",
...). Inside ``sharding.logical_context(mesh, rules)`` those names map to mesh
axes; outside it (tests, export, a single device) ``constrain`` is a no-op,
so the model never needs to know about meshes.
"""

import jax
from flax.core import spmd as flax_spmd
from jax.sharding import PartitionSpec


def to_partition_spec(logical_axes, rules) -> PartitionSpec:
  """Map a tuple of logical names to a PartitionSpec with the rules table."""
  return PartitionSpec(*flax_spmd.from_sharding_rules(tuple(logical_axes),
                                                      rules))


def constrain(x: jax.Array, logical_axes) -> jax.Array:
  """with_sharding_constraint by logical names, when a mesh and rules are set."""
  rules = flax_spmd.get_logical_axis_rules()
  if not rules or jax.sharding.get_abstract_mesh().empty:
    return x
  return jax.lax.with_sharding_constraint(
      x, to_partition_spec(logical_axes, rules))
