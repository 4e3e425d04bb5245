"""Pluggable objectives: what differs between BERT, ELECTRA, ... and tasks.

The trainer, mesh, checkpoints and input pipeline are shared. What a model
family (or a fine-tuning task) adds is one :class:`Objective`: how to build
its model(s), which batch features it reads, and its loss and metrics as pure
functions. The train step receives the objective as an argument, so nothing
in ``training/`` branches on the family, and tools (benchmarks, ablations)
plug in their own variants without patching module globals.

  __init__.py      the ``Objective`` dataclass and the registry
                   (``objective.name`` -> module, imported on first use)
  bert.py          BERT: masked LM plus NSP / SOP, or packed
  albert.py        ALBERT: masked LM plus sentence order, shared layers
  electra.py       ELECTRA: generator MLM plus replaced-token detection
  distil.py        DistilBERT: a student distilled from a frozen teacher
  modernbert.py    ModernBERT: masked LM alone
  classify.py      fine-tuning: sequence classification or regression
  modernbert_classify.py  the same on a ModernBERT encoder
  token_classify.py  fine-tuning: token tagging (NER)
  span_qa.py       fine-tuning: extractive QA (answer start and end)
  modernbert_token_classify.py, modernbert_span_qa.py  the two on ModernBERT

Loss normalisation is global: ``loss_sums`` returns per-batch SUMS (so that
microbatches and devices add up) including count entries, ``counts`` gives
the same count entries for the whole global batch, and ``loss`` / ``metrics``
divide one by the other. Eval accumulates sums over batches and calls
``metrics(totals, totals, config)``.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from bert_jax import config_lib
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from bert_jax.models import flops as flops_lib


@dataclasses.dataclass(frozen=True)
class Objective:
  """One family's (or task's) model, features, loss and metrics."""
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
  # (label on the log line, metric name) printed on every step line.
  log_keys: tuple[tuple[str, str], ...] = (("loss", "loss"),)
  # Optional per-example outputs for evaluators that score every example
  # (task metrics, predictions files): (model, batch, config) -> {name:
  # array}, deterministic, each array with the batch's rows as its leading
  # dimension. Classification gives logits [B, C]; a token or span head
  # [B, T, ...] per position; a packed row holding several examples gathers
  # them into per-row slots [B, K, ...] and returns the slots' own example
  # weights beside them, so the evaluator keeps the real ones. Programs
  # jits it as `predict_step` (with the loss sums), replicated on every
  # process; the trainer never reads the names.
  predict: Callable[..., dict] | None = None
  # Optional params held fixed while training, e.g. a distillation teacher:
  # (config, rngs) -> nnx.Module. They live in the train state as
  # state["frozen"], sharded by the same logical rules, with no gradient and
  # no optimizer state; loss_sums then gets the merged module as `frozen=`.
  make_frozen: Callable[..., Any] | None = None
  # Optional start of a new run: (config, params, frozen) -> (params, frozen),
  # nested dicts of host arrays (e.g. load the teacher, copy its layers into
  # the student). Not called on resume: the checkpoint holds both.
  warm_start: Callable[..., Any] | None = None
  # Optional paths a new run's params come from besides train.init_from
  # (a distillation teacher): (config) -> {config field: path}. The run
  # takes their tokenizer (training/start_from.py), checked at startup.
  param_sources: Callable[..., dict] | None = None
  # Optional Hugging Face export of the trained params: (config, params) ->
  # one or more checkpoint_io.HFModel (subdirectory, hf.mapping family,
  # model config, params), each written as one HF directory. None: one
  # model at the top, the family whose table names this objective
  # (hf.mapping.for_objective) with config.model and all params.
  hf_export: Callable[..., Any] | None = None
  # Optional analytic training FLOPs (forward + backward) of a step's work:
  # (config, models.flops.Work) -> float. None: BERT's, the model of
  # config.model with MLM logits at the predicted positions (flops.bert_flops).
  flops: Callable[..., float] | None = None
  # Optional config checks of this objective's job, run by
  # config_checks.validate (also per phase) before anything is written:
  # (config) -> None, ValueError naming the field. The objective says which
  # apply: its own fields and those of the input it reads (pretraining
  # objectives: the pretraining pipeline's, `data.checks.check_pretraining`;
  # tasks: the sequence shape, `data.checks.check_sequence`, and theirs).
  validate: Callable[..., None] | None = None
  # Whether the objective reads packed rows (data.packing: sequence_ids,
  # position_ids, one [CLS] per packed example; features.PACKING).
  packing: bool = False
  # Optional start of fine-tuning from this family's runs
  # (downstream/finetuning.py):
  # the BertModel that the classifier wraps. (run config) -> its model
  # config; None: config.model.
  encoder_config: Callable[..., Any] | None = None
  # (params of the run, run config) -> the BertModel param subtree
  # (embeddings, embeddings_project when E != H, layers, pooler if trained).
  # None: params["bert"].
  encoder_params: Callable[..., Any] | None = None
  # The objectives that fine-tune this family's runs, by task kind
  # ("sentence", "token", "span": downstream/finetuning.py's KINDS) ->
  # objective name; a kind left out is one that family cannot fine-tune.
  # None: BERT's heads on the BertModel encoder (classify, token_classify,
  # span_qa).
  finetune_objectives: Mapping[str, str] | None = None
  # With its own classifier: (params of the source in this family's tree,
  # fresh classifier params) -> the classifier's params (what it takes over
  # from the source). None: the BertModel hooks above.
  finetune_params: Callable[..., Any] | None = None


# name -> module defining OBJECTIVE; imported on first use.
_MODULES = {
    "albert": "bert_jax.objectives.albert",
    "bert": "bert_jax.objectives.bert",
    "classify": "bert_jax.objectives.classify",
    "electra": "bert_jax.objectives.electra",
    "distil": "bert_jax.objectives.distil",
    "modernbert": "bert_jax.objectives.modernbert",
    "modernbert_classify": "bert_jax.objectives.modernbert_classify",
    "modernbert_span_qa": "bert_jax.objectives.modernbert_span_qa",
    "modernbert_token_classify":
        "bert_jax.objectives.modernbert_token_classify",
    "span_qa": "bert_jax.objectives.span_qa",
    "token_classify": "bert_jax.objectives.token_classify",
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


def train_flops_per_step(config, work: flops_lib.Work | None = None) -> float:
  """Model FLOPs of one optimizer step of `config`: the objective's own count
  (``Objective.flops``) or BERT's (``models.flops.bert_flops``), on `work`
  (None: full rows of the global batch, ``flops.full_rows``)."""
  if work is None:
    work = flops_lib.full_rows(config.train.batch_size, config.data.seq_length,
                               config.data.max_predictions_per_seq)
  return (for_config(config).flops or flops_lib.bert_flops)(config, work)


# ------------------------------------------------------------------------------
# What a run's params are, by its objective. `config` is a complete run config
# (a ``pretrained.Source``'s: which objective trained the params is decided
# there, once); these read the objective's hooks, each with one default.
# ------------------------------------------------------------------------------
def hf_model(config, params, model_config=None, subdir: str = ""
             ) -> checkpoint_io.HFModel:
  """One HF model of a run: the family whose table names its objective."""
  return checkpoint_io.HFModel(
      subdir, mapping.for_objective(config.objective.name).name,
      config.model if model_config is None else model_config, params)


def hf_models(config, params) -> tuple[checkpoint_io.HFModel, ...]:
  """The Hugging Face models a run holds (``Objective.hf_export``)."""
  objective = for_config(config)
  if objective.hf_export is not None:
    return tuple(objective.hf_export(config, params))
  return (hf_model(config, params),)


def masked_lm(config, params) -> checkpoint_io.HFModel:
  """The run's model that fills masks (fill_mask, zero_shot): the first of
  its HF models whose family has a masked-LM head (ELECTRA: the
  generator). ValueError when it has none (a fine-tuned classifier)."""
  models = hf_models(config, params)
  for m in models:
    if mapping.get(m.family).masked_lm:
      return m
  raise ValueError(
      f"A {config.objective.name!r} run holds no masked-LM head (its models: "
      f"{', '.join(m.family for m in models)}): nothing to fill masks with.")


# Fine-tuning objectives whose params are a head on another family's encoder
# (objective.encoder names it: its Hugging Face class, its pooler_act).
HEAD_ON_ENCODER = ("classify", "token_classify", "span_qa")


def encoder_name(config) -> str:
  """The pretraining objective whose encoder a run's params hold: its own,
  or for a fine-tuned classifier the one it was fine-tuned from
  (``objective.encoder``, which picks its head and Hugging Face class)."""
  if config.objective.name in HEAD_ON_ENCODER:
    return config.objective.encoder
  return config.objective.name


def encoder_config(config):
  """The BertModel config fine-tuning wraps (``Objective.encoder_config``,
  default config.model)."""
  objective = for_config(config)
  return (objective.encoder_config(config) if objective.encoder_config
          else config.model)


def encoder_params(params, config) -> dict:
  """The BertModel params of a run (``Objective.encoder_params``, default
  params["bert"])."""
  objective = for_config(config)
  if objective.encoder_params is not None:
    return objective.encoder_params(params, config)
  if "bert" not in params:
    raise ValueError(f"A {objective.name!r} run's params hold no BERT "
                     "encoder (no 'bert' subtree).")
  return params["bert"]
