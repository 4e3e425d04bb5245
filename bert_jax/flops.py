"""Analytic training FLOPs, achieved TFLOP/s and MFU.

Training FLOPs count the matmuls only, forward plus backward (x3), as in
Kaplan et al. 2020 / the PaLM appendix:

  encoder, per token:   6 * L * (4 d^2 + 2 d d_ff)  +  12 * L * T * d
  MLM head, per position that gets vocabulary logits:  6 * (d^2 + d V)

(the 12 L T d term is QK^T and PV; embeddings, LayerNorm, softmax, GELU, the
pooler and the NSP head are left out). With factorized embeddings (width
E != d) the encoder adds the projection, 6 E d per token, and the MLM head
maps d -> E: 6 (d E + E V).

Each objective may count its own step (``Objective.flops``, FLOPs of one
sequence, built from the functions here); :func:`train_flops_per_step` uses
it, else BERT's count (:func:`bert_flops_per_sequence`; ALBERT's too: layer
sharing saves parameters, not FLOPs). ELECTRA counts both networks
(``objectives/electra.py``), DistilBERT the student's training plus the
frozen teacher's forward pass (``objectives/distil.py``). bert_jax gathers the
``max_predictions_per_seq`` masked positions before the MLM head, so P
positions per sequence get logits; a model that computes logits everywhere
(Hugging Face ``FlaxBertForPreTraining``) does T of them and spends more FLOPs
for the same useful work. MFU here is always *model* FLOPs of our model: the
same number for any implementation of the same training step.

Peak: known accelerators from a table (dense bf16; fp32 matmuls on TPU run
as bf16 passes at default precision, on GPU as TF32), a configured value
(``train.peak_tflops``), or on CPU a measured jitted 2048^3 matmul in the
compute dtype (bf16 inputs with float32 accumulation, like ``model.matmul``).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp

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


def _embedding_size(model_config) -> int:
  return int(model_config.get("embedding_size", 0) or model_config.hidden_size)


def encoder_flops_per_token(model_config, seq_length: int) -> float:
  """Training FLOPs of the encoder stack per token (forward + backward),
  with the E -> d embedding projection when the embeddings are factorized."""
  L = model_config.num_hidden_layers
  d = model_config.hidden_size
  f = model_config.intermediate_size
  e = _embedding_size(model_config)
  project = 6.0 * e * d if e != d else 0.0
  return 6.0 * L * (4 * d * d + 2 * d * f) + 12.0 * L * seq_length * d + project


def mlm_head_flops_per_position(model_config) -> float:
  """Training FLOPs of the MLM head (transform d -> E + tied decoder)."""
  d, v = model_config.hidden_size, model_config.vocab_size
  e = _embedding_size(model_config)
  return 6.0 * (d * e + e * v)


def train_flops_per_sequence(model_config, seq_length: int,
                             logit_positions: int) -> float:
  """Training FLOPs for one sequence with `logit_positions` MLM positions."""
  return (seq_length * encoder_flops_per_token(model_config, seq_length)
          + logit_positions * mlm_head_flops_per_position(model_config))


def train_flops_per_token(model_config, seq_length: int,
                          logit_positions: int) -> float:
  return train_flops_per_sequence(model_config, seq_length,
                                  logit_positions) / seq_length


def bert_flops_per_sequence(config) -> float:
  """BERT's step per sequence: config.model on every token, MLM logits at
  the max_predictions_per_seq gathered positions (the default count)."""
  return train_flops_per_sequence(config.model, config.data.seq_length,
                                  config.data.max_predictions_per_seq)


def forward_flops(training_flops: float) -> float:
  """The forward pass alone: 2 of the 6 FLOPs per multiply-add (a frozen
  network that computes no gradient)."""
  return training_flops / 3.0


def train_flops_per_step(config) -> float:
  """Model FLOPs of one optimizer step of `config` (global batch): the
  objective's own count (``Objective.flops``) or BERT's."""
  from bert_jax import objectives  # pylint: disable=g-import-not-at-top
  objective = config.get("objective", None)
  name = objective.get("name", "bert") if objective is not None else "bert"
  per_sequence = objectives.get(name).flops or bert_flops_per_sequence
  return config.train.batch_size * per_sequence(config)


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
