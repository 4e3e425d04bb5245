"""What the trainer runs: an :class:`Objective` (model, features, loss).

The trainer, mesh, checkpoints and input pipeline are shared. What differs
between BERT, ELECTRA, ... pretraining, and between fine-tuning task kinds,
is one Objective: how to build the model, which batch features it reads,
and its loss and metrics as pure functions. The train step receives the
objective as an argument, so nothing in ``training/`` branches on a family
or a kind. Pretraining objectives live here, one module each, and belong
to a family (``bert_jax/families/``); a fine-tuning objective is a task
kind's head on a family's encoder (``bert_jax/compose.py``).

  __init__.py   the Objective and Teacher records, shared loss helpers
  bert.py       BERT: masked LM plus NSP / SOP, or packed
  albert.py     ALBERT: masked LM plus sentence order, shared layers
  electra.py    ELECTRA: generator MLM plus replaced-token detection
  distil.py     DistilBERT: a student distilled from a frozen teacher
  modernbert.py ModernBERT: masked LM alone
  roberta.py    RoBERTa / XLM-R: masked LM alone on full sentences

Loss normalisation is global: ``loss_sums`` returns per-batch SUMS (so that
microbatches and devices add up) including count entries, ``counts`` gives
the same count entries for the whole global batch, and ``loss`` / ``metrics``
divide one by the other. Eval accumulates sums over batches and calls
``metrics(totals, totals, config)``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp

from bert_jax import config_lib


@dataclasses.dataclass(frozen=True)
class Teacher:
  """Fixed params a run trains against (a distillation teacher): kept in
  the train state as state["frozen"], sharded by the same logical rules,
  with no gradient and no optimizer state; loss_sums gets the module as
  `frozen=`. The trainer loads them (``training/start_from.py`` checks the
  path at startup, before anything is written)."""
  # The config field naming the path ("objective.teacher").
  field: str
  # (config) -> the path, or "" when the params start at random (tests).
  path: Callable[..., str]
  # (config, rngs) -> the frozen nnx.Module.
  make_model: Callable[..., Any]
  # The family (``bert_jax.families`` name) the path must hold.
  family: str
  # (config, teacher params) -> the student's starting params (host
  # arrays). Not called on resume: the checkpoint holds both.
  init_student: Callable[..., Any]


@dataclasses.dataclass(frozen=True)
class SplitLoss:
  """A loss over per-example vectors that each example's rows give on
  their own (a bi-encoder's: no attention across examples), in two parts,
  so that a step may embed the batch in chunks and cache the loss's
  gradient with respect to the vectors (``training/cached_gradients.py``,
  ``train.cache_chunk_size``). ``sums(embed(...), batch, config)`` equals
  the objective's ``loss_sums``."""
  # (model, batch, rng, deterministic, config) -> vectors [B, ...] (one
  # array), row i from batch row i alone.
  embed: Callable[..., Any]
  # (vectors, batch, config) -> {name: f32 sum}: loss_sums given them.
  sums: Callable[..., dict]


@dataclasses.dataclass(frozen=True)
class Objective:
  """One pretraining objective's (or fine-tuning head's) model, features,
  loss and metrics."""
  name: str
  # (config, rngs: nnx.Rngs) -> nnx.Module holding every trainable param.
  make_model: Callable[..., Any]
  # (config) -> a `bert_jax.data.features` spec dict.
  feature_spec: Callable[..., dict]
  # (model, batch, rng key, deterministic: bool, config) -> {name: f32 sum}.
  loss_sums: Callable[..., dict]
  # (global batch, config) -> {count name: f32}; keys also in loss_sums.
  counts: Callable[..., dict]
  # (sums, counts, config) -> the scalar that is differentiated.
  loss: Callable[..., Any]
  # (sums, counts, config) -> {metric name: scalar} for logs.
  metrics: Callable[..., dict]
  # (config, models.flops.Work) -> analytic training FLOPs (forward +
  # backward) of a step's work.
  flops: Callable[..., float]
  # (config) -> None, or a ValueError naming the field: this objective's
  # checks, run by config_checks.validate (also per phase) before anything
  # is written. It says which apply: its model's, and those of the input
  # it reads (pretraining: the pretraining pipeline's,
  # `data.checks.check_pretraining`; tasks: the sequence shape and theirs).
  validate: Callable[..., None]
  # (label on the log line, metric name) printed on every step line.
  log_keys: tuple[tuple[str, str], ...] = (("loss", "loss"),)
  # Whether the objective reads packed rows (data.packing: sequence_ids,
  # position_ids, one [CLS] per packed example; features.PACKING).
  packing: bool = False
  # Per-example outputs for evaluators that score every example (task
  # metrics, predictions files): (model, batch, config) -> {name: array},
  # deterministic, each array with the batch's rows as its leading
  # dimension (packed rows: per-row slots [B, K, ...]). Programs jits it
  # as `predict_step` (with the loss sums). None: the objective scores no
  # examples (pretraining).
  predict: Callable[..., dict] | None = None
  # Fixed params trained against (distillation); None: none.
  teacher: Teacher | None = None
  # The loss as vectors per example and a loss over them (a bi-encoder),
  # which train.cache_chunk_size > 0 steps in chunks; None: a loss of the
  # batch as a whole.
  split: SplitLoss | None = None


def check_packed_input(config, family: str) -> None:
  """ValueError when a family with no sentence-pair head is given pair
  batches (data.nsp / data.objective 'nsp' or 'sop'): half of those pairs
  have a random or swapped second segment, which only corrupts its MLM
  input, and nothing would learn the pair label."""
  data = config.data
  kind = config_lib.sentence_objective(data)
  if kind == config_lib.PACKED:
    return
  field = (f"data.objective={data.objective!r}" if data.objective else
           f"data.nsp={data.nsp}")
  second = "random" if kind == config_lib.NSP else "swapped"
  raise ValueError(
      f"{field}: {family} trains no sentence-pair head, so {kind.upper()} "
      f"pairs (half of them with a {second} second segment) would only "
      "corrupt its input; set data.nsp=False (packed full sentences, as "
      f"{family} was published).")


def safe_div(total, count):
  """total / max(count, 1): jnp inside a trace, Python floats on the host
  (eval totals are accumulated in float64 and stay so)."""
  if isinstance(count, (jax.Array, jnp.ndarray)):
    return total / jnp.maximum(count, 1.0)
  return total / max(count, 1.0)
