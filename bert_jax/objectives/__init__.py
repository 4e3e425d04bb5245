"""Pluggable objectives: what differs between BERT, ELECTRA, ... and tasks.

The trainer, mesh, checkpoints and input pipeline are shared. What a model
family (or a fine-tuning task) adds is one :class:`Objective`: how to build
its model(s), which batch features it reads, and its loss and metrics as pure
functions. The train step receives the objective as an argument, so nothing
in ``train.py`` branches on the family, and tools (benchmarks, ablations)
plug in their own variants without patching module globals.

Loss normalisation is global: ``loss_sums`` returns per-batch SUMS (so that
microbatches and devices add up) including count entries, ``counts`` gives
the same count entries for the whole global batch, and ``loss`` / ``metrics``
divide one by the other. Eval accumulates sums over batches and calls
``metrics(totals, totals, config)``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import jax
import jax.numpy as jnp

from bert_jax.models import flops as flops_lib


@dataclasses.dataclass(frozen=True)
class Objective:
  """One family's (or task's) model, features, loss and metrics."""
  name: str
  # (config, rngs: nnx.Rngs) -> nnx.Module holding every trainable param.
  make_model: Callable[..., Any]
  # (config) -> a `bert_jax.features` spec dict.
  feature_spec: Callable[..., dict]
  # (model, batch, rng key, deterministic: bool, config) -> {name: f32 sum}.
  loss_sums: Callable[..., dict]
  # (global batch, config) -> {count name: f32}; keys also in loss_sums.
  counts: Callable[..., dict]
  # (sums, counts, config) -> the scalar that is differentiated.
  loss: Callable[..., Any]
  # (sums, counts, config) -> {metric name: scalar} for logs.
  metrics: Callable[..., dict]
  # (label on the log line, metric name) printed on every step line.
  log_keys: tuple[tuple[str, str], ...] = (("loss", "loss"),)
  # Optional params held fixed while training, e.g. a distillation teacher:
  # (config, rngs) -> nnx.Module. They live in the train state as
  # state["frozen"], sharded by the same logical rules, with no gradient and
  # no optimizer state; loss_sums then gets the merged module as `frozen=`.
  make_frozen: Callable[..., Any] | None = None
  # Optional start of a new run: (config, params, frozen) -> (params, frozen),
  # nested dicts of host arrays (e.g. load the teacher, copy its layers into
  # the student). Not called on resume: the checkpoint holds both.
  warm_start: Callable[..., Any] | None = None
  # Optional Hugging Face export of the trained model: (config) -> (family
  # name in bert_jax.hf.mapping, model config of the exported model).
  # None: BERT's ("bert", config.model).
  hf_export: Callable[..., Any] | None = None
  # Optional analytic training FLOPs (forward + backward) of a step's work:
  # (config, models.flops.Work) -> float. None: BERT's, the model of
  # config.model with MLM logits at the predicted positions (flops.bert_flops).
  flops: Callable[..., float] | None = None
  # Optional family-specific config checks, run by config_checks.validate
  # before anything is written: (config) -> None, ValueError naming the field.
  validate: Callable[..., None] | None = None
  # Whether the objective reads packed rows (data.packing: sequence_ids,
  # position_ids, one [CLS] per packed example; features.PACKING).
  packing: bool = False
  # Optional start of fine-tuning from this family's runs (finetune.py):
  # the BertModel that the classifier wraps. (run config) -> its model
  # config; None: config.model.
  encoder_config: Callable[..., Any] | None = None
  # (params of the run, run config) -> the BertModel param subtree
  # (embeddings, embeddings_project when E != H, layers, pooler if trained).
  # None: params["bert"].
  encoder_params: Callable[..., Any] | None = None


# name -> module defining OBJECTIVE; imported on first use.
_MODULES = {
    "albert": "bert_jax.objectives.albert",
    "bert": "bert_jax.objectives.bert",
    "classify": "bert_jax.objectives.classify",
    "electra": "bert_jax.objectives.electra",
    "distil": "bert_jax.objectives.distil",
}


def names() -> tuple[str, ...]:
  return tuple(_MODULES)


def get(name: str) -> Objective:
  """The objective registered as `name` (a ValueError lists the others)."""
  if name not in _MODULES:
    raise ValueError(f"objective.name={name!r} is not one of "
                     f"{', '.join(repr(n) for n in _MODULES)}.")
  return importlib.import_module(_MODULES[name]).OBJECTIVE


def for_config(config) -> Objective:
  return get(config.objective.name)


def safe_div(total, count):
  """total / max(count, 1): jnp inside a trace, Python floats on the host
  (eval totals are accumulated in float64 and stay so)."""
  if isinstance(count, (jax.Array, jnp.ndarray)):
    return total / jnp.maximum(count, 1.0)
  return total / max(count, 1.0)


def train_flops_per_step(config, work: flops_lib.Work | None = None) -> float:
  """Model FLOPs of one optimizer step of `config`: the objective's own count
  (``Objective.flops``) or BERT's (``models.flops.bert_flops``), on `work`
  (None: full rows of the global batch, ``flops.full_rows``)."""
  objective = config.get("objective", None)
  name = objective.get("name", "bert") if objective is not None else "bert"
  if work is None:
    work = flops_lib.full_rows(config.train.batch_size, config.data.seq_length,
                               config.data.max_predictions_per_seq)
  return (get(name).flops or flops_lib.bert_flops)(config, work)
