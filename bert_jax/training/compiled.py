"""Ahead-of-time compiling of a jitted step, and what XLA says it costs.

The trainer compiles its steps before the loop (a shape that does not fit
fails at start-up, not hours in) and logs their per-device memory; the
benchmarks time compiled steps and report their memory; the TPU compile
check compiles for a TPU topology with no TPU and turns XLA's counts into a
roofline. All of them go through `compile_ahead`: ``jitted.lower(*args)
.compile()``, its wall time, XLA's ``memory_analysis()`` (None on backends
without one) and ``cost_analysis()`` (per device: FLOPs, bytes accessed).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import numpy as np

MB = 2 ** 20


@dataclasses.dataclass(frozen=True)
class Memory:
  """XLA's per-device memory of a compiled program, in bytes."""
  arguments: int  # Inputs: state and batch.
  temporaries: int  # Activations and scratch.
  outputs: int
  aliased: int  # Outputs written over donated arguments.

  @property
  def peak(self) -> int:
    """Bytes live during a step: what does not alias, all at once."""
    return self.arguments + self.outputs + self.temporaries - self.aliased

  def __str__(self) -> str:
    return (f"per-device memory: arguments {self.arguments / MB:.1f} MB, "
            f"temporaries {self.temporaries / MB:.1f} MB, outputs "
            f"{self.outputs / MB:.1f} MB")


@dataclasses.dataclass(frozen=True)
class Cost:
  """XLA's cost analysis of a compiled program, per device."""
  flops: float  # Every op's, optimizer included; custom calls count none.
  bytes_accessed: float


@dataclasses.dataclass(frozen=True)
class AheadOfTime:
  """A compiled step (call it like the jitted function), its compile time,
  and XLA's analyses of it."""
  executable: Any  # jax.stages.Compiled
  seconds: float  # Lowering and compiling.

  def __call__(self, *args):
    return self.executable(*args)

  @property
  def memory(self) -> Memory | None:
    return memory(self.executable)

  @property
  def cost(self) -> Cost:
    return cost(self.executable)


def memory(executable) -> Memory | None:
  """XLA's memory analysis of `executable` (None where the backend has
  none)."""
  m = executable.memory_analysis()
  if m is None:
    return None
  return Memory(arguments=m.argument_size_in_bytes,
                temporaries=m.temp_size_in_bytes,
                outputs=m.output_size_in_bytes,
                aliased=m.alias_size_in_bytes)


def cost(executable) -> Cost:
  """XLA's cost analysis of `executable` (one dict, or one per device
  program in older jax)."""
  c = executable.cost_analysis()
  c = (c[0] if c else {}) if isinstance(c, (list, tuple)) else (c or {})
  return Cost(flops=float(c.get("flops", 0.0)),
              bytes_accessed=float(c.get("bytes accessed", 0.0)))


def bytes_per_device(abstract_tree) -> int:
  """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs."""
  total = 0
  for a in jax.tree.leaves(abstract_tree):
    shard = a.sharding.shard_shape(a.shape)
    total += int(np.prod(shard)) * np.dtype(a.dtype).itemsize
  return total


def compile_ahead(jitted, *args) -> AheadOfTime:
  """`jitted` lowered for `args` (arrays or ShapeDtypeStructs, with their
  shardings) and compiled, timed. Run it inside the mesh / sharding-rules
  context the step needs (``Programs.context()``)."""
  start = time.perf_counter()
  executable = jitted.lower(*args).compile()
  return AheadOfTime(executable, time.perf_counter() - start)
