"""bert_jax/training/compiled.py: ahead-of-time compiling and XLA's memory
and cost analyses, as the trainer, the benchmarks and the TPU compile check
report them."""

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.training import compiled


def test_compile_ahead_runs_and_reports_memory_and_flops():
  m, k, n = 64, 128, 32
  step = jax.jit(lambda a, b: a @ b)
  a = jax.ShapeDtypeStruct((m, k), jnp.float32)
  b = jax.ShapeDtypeStruct((k, n), jnp.float32)
  aot = compiled.compile_ahead(step, a, b)
  assert aot.seconds > 0
  x, y = np.ones((m, k), np.float32), np.full((k, n), 2.0, np.float32)
  np.testing.assert_array_equal(aot(x, y), np.full((m, n), 2.0 * k))
  assert aot.cost.flops == 2 * m * k * n
  assert aot.cost.bytes_accessed >= 4 * (m * k + k * n + m * n)
  mem = aot.memory
  assert mem.arguments == 4 * (m * k + k * n)
  assert mem.outputs == 4 * m * n
  assert mem.peak == mem.arguments + mem.outputs + mem.temporaries


def test_memory_line_is_the_trainers():
  mem = compiled.Memory(arguments=int(49.7 * 2**20), temporaries=int(
      336.6 * 2**20), outputs=int(49.6 * 2**20), aliased=int(49.6 * 2**20))
  assert str(mem) == ("per-device memory: arguments 49.7 MB, temporaries "
                      "336.6 MB, outputs 49.6 MB")
  assert mem.peak == mem.arguments + mem.temporaries


def test_donated_arguments_are_aliased():
  step = jax.jit(lambda s: s * 2, donate_argnums=0)
  mem = compiled.compile_ahead(step, jax.ShapeDtypeStruct(
      (256,), jnp.float32)).memory
  assert mem.aliased == 4 * 256
  assert mem.peak == mem.arguments + mem.temporaries
