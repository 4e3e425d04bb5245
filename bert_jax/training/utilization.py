"""Peak TFLOP/s per device and model FLOPs utilization (MFU).

The model FLOPs of a step are analytic (``models/flops.py``, per objective
via ``compose.train_flops_per_step``); this module gives the denominator:
a known accelerator's spec-sheet peak, a configured value, or on CPU a
measured jitted matmul.
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import compose
from bert_jax.models import flops as flops_lib

# Dense peak TFLOP/s per chip: (bf16, fp32 matmul at JAX default precision).
KNOWN_PEAKS = {
    "tpu v4": (275.0, 275.0),
    "tpu v5 lite": (197.0, 197.0),  # v5e reports "TPU v5 lite".
    "tpu v5e": (197.0, 197.0),
    "tpu v5p": (459.0, 459.0),
    "tpu v5": (459.0, 459.0),
    "tpu v6 lite": (918.0, 918.0),  # v6e (Trillium).
    "tpu v6e": (918.0, 918.0),
    "a100": (312.0, 156.0),
    "h100": (989.0, 494.0),
    "h200": (989.0, 494.0),
}



def known_peak_tflops(device_kind: str, dtype) -> float | None:
  """Per-chip peak for a known accelerator, else None."""
  kind = device_kind.lower()
  bf16 = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
  # Longest names first so "tpu v5 lite" wins over "tpu v5".
  for name in sorted(KNOWN_PEAKS, key=len, reverse=True):
    if name in kind:
      return KNOWN_PEAKS[name][0 if bf16 else 1]
  return None


def measure_matmul_tflops(dtype, n: int = 2048, repeats: int = 5,
                          cache: bool = True) -> float:
  """Best-of-`repeats` TFLOP/s of a jitted n^3 matmul on the default device.

  Inputs in `dtype`, float32 accumulation (``preferred_element_type``), as the
  model's matmuls. The best run is the peak: noise only makes runs slower.
  With `cache`, the first measurement per (dtype, n) is reused in-process.
  """
  name = jnp.dtype(dtype).name
  return (_measure_cached if cache else _measure)(name, n, repeats)


def _measure(dtype_name: str, n: int, repeats: int) -> float:
  dtype = jnp.dtype(dtype_name)
  ka, kb = jax.random.split(jax.random.key(0))
  a = jax.random.normal(ka, (n, n), jnp.float32).astype(dtype)
  b = jax.random.normal(kb, (n, n), jnp.float32).astype(dtype)
  f = jax.jit(lambda a, b: jnp.matmul(a, b,
                                      preferred_element_type=jnp.float32))
  f(a, b).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, b).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best / 1e12


_measure_cached = functools.lru_cache(maxsize=None)(_measure)


def peak_tflops(dtype, configured: float = 0.0, device=None) -> tuple[float, str]:
  """(per-device peak TFLOP/s, where it came from) for the compute dtype."""
  if configured and configured > 0:
    return float(configured), "configured"
  device = device or jax.devices()[0]
  known = known_peak_tflops(device.device_kind, dtype)
  if known is not None:
    return known, f"spec sheet ({device.device_kind})"
  return measure_matmul_tflops(dtype), "measured 2048^3 matmul"


def mfu(flops_per_step: float, step_seconds: float, num_devices: int,
        peak: float) -> tuple[float, float]:
  """(achieved TFLOP/s per device, MFU as a fraction of `peak`)."""
  tflops = flops_per_step / max(step_seconds, 1e-12) / num_devices / 1e12
  return tflops, (tflops / peak if peak > 0 else 0.0)


class Throughput:
  """Real tokens/s, packing efficiency and MFU over the steps since the last
  log line, from each step's ``work`` (``steps.batch_work``): the steps'
  device scalars are kept (no op, no read between log lines) and read and
  summed once per log line.

  MFU counts the real work (``models/flops.py``): real tokens, each
  sequence's own attention, the real MLM positions; ``tokens_per_sec``
  counts the row slots (every position of the batch, padding included).
  """

  def __init__(self, peak: float):
    self.peak = peak
    self.restart()

  def add(self, work) -> None:
    self._work.append(work)

  def restart(self) -> None:
    self._work, self._start = [], time.time()

  def read(self, config) -> dict:
    """The rates since the last read (`config`: the phase's, for FLOPs)."""
    seconds = max(time.time() - self._start, 1e-9)
    steps = jax.device_get(self._work)
    w = {k: float(sum(np.float64(s[k]) for s in steps)) for k in steps[0]}
    steps = len(steps)
    self.restart()
    flops = compose.train_flops_per_step(config, flops_lib.Work(
        tokens=w["tokens"], attended=w["attended"],
        predictions=w["predictions"]))
    tflops, utilized = mfu(flops, seconds, jax.device_count(), self.peak)
    return dict(tokens_per_sec=w["slots"] / seconds,
                real_tokens_per_sec=w["tokens"] / seconds,
                packing_efficiency=w["tokens"] / max(w["slots"], 1.0),
                steps_per_sec=steps / seconds, tflops_per_device=tflops,
                mfu=utilized)
