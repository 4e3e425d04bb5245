"""Encoder families: each owns its encoder, once.

A family (BERT, ALBERT, ELECTRA, DistilBERT, ModernBERT, RoBERTa, XLM-R)
declares, in one module, everything that is its own: the encoder and its
model config fields, its Hugging Face tables read both ways (the pretraining
classes and the bare encoder, ``{Prefix}Model``), where its Hugging Face
task classes put a head (:class:`bert_jax.models.heads.HeadLayout`), its
pretraining objective(s), the FLOPs of its encoder, and how a run of it
holds its encoder. Task kinds (``bert_jax/tasks/``) know nothing of families; any
family's encoder with any kind's head is derived (``bert_jax/compose.py``).

  bert.py        BERT (BertForPreTraining / MaskedLM / Model)
  albert.py      ALBERT (shared layers, untied when fine-tuned)
  electra.py     ELECTRA (discriminator / generator pair; the discriminator
                 is the encoder)
  distilbert.py  DistilBERT (the student of a distillation run)
  modernbert.py  ModernBERT (pre-norm, rotary, GeGLU; its prediction head
                 before every task head)
  roberta.py     RoBERTa (BERT's encoder, positions from the padding id,
                 no NSP head)
  xlm_roberta.py XLM-R (RoBERTa's architecture under its own classes)

Adding a family is one module here (plus its model in ``models/`` when it
is a new architecture) and one line in :data:`MODULES`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping

from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from bert_jax.models import heads
from bert_jax.objectives import Objective


@dataclasses.dataclass(frozen=True)
class Family:
  """One encoder family. See the module docstring."""
  name: str  # registry key; config.json model_type
  title: str  # as people write it in a sentence: "BERT", "ModernBERT"
  # Pretraining objectives that train this family (``objective.name``).
  objectives: tuple[Objective, ...]
  # Hugging Face tables of its pretraining classes (a directory of one of
  # them imports as a run of objectives[0]).
  pretraining_tables: tuple[mapping.Table, ...]
  # The bare encoder's table (``{Prefix}Model``): its rows under
  # `encoder_attr`, config.json both ways. Every task table extends it.
  encoder_table: mapping.Table
  encoder_attr: str  # our subtree of the encoder in task models
  # (model_config, rngs, pooler: bool) -> the encoder module; its call
  # returns (token states [B, T, d], pooled [B, d] or None).
  make_encoder: Callable[..., Any]
  head_layout: heads.HeadLayout
  # Hugging Face names of the head params the layout adds: the pooler's
  # rows (under the encoder: "bert.pooler.*"), the transform's ("head.*"),
  # and per role the output's HF name when it is not the kind's own name
  # (ELECTRA's pooled "classifier.out_proj", ModernBERT's span
  # "classifier"); Google TF names of outputs per role (BERT's).
  pooler_rows: tuple[mapping.Row, ...]
  transform_rows: tuple[mapping.Row, ...]
  output_hf: Mapping[str, str]
  output_tf: Mapping[str, tuple[str, str]]
  # (model_config, work, seq_length) -> training FLOPs of the encoder.
  encoder_flops: Callable[..., float]
  # (model_config) -> None or ValueError: the encoder's own checks.
  validate_model: Callable[..., None]
  # A pretraining run of this family (config, params) -> the encoder's
  # model config and params ({encoder_attr: ..., "head": ... when the
  # layout has a transform the run trained}).
  pretrained_encoder_config: Callable[..., Any]
  pretrained_encoder_params: Callable[..., dict]
  # A pretraining run (config, params) -> the Hugging Face models it holds
  # (``checkpoint_io.HFModel``): its pretraining class(es).
  hf_models: Callable[..., tuple]
  # (model config of a pretraining directory) -> the objective fields of
  # the run it implies (DistilBERT: student_layers).
  hf_run_fields: Callable[..., dict] = lambda model_config: {}
  # (config.json dict) -> whether a directory of one of this family's task
  # classes is read as that task (ALBERT: only with one group per layer;
  # a released ALBERT classifier with shared groups reads as ALBERT).
  reads_task_dir: Callable[[Mapping[str, Any]], bool] = lambda hf: True

  @property
  def class_prefix(self) -> str:
    """"Bert", "ModernBert", ...: the Hugging Face class names' stem."""
    return self.encoder_table.export_architecture[:-len("Model")]

  def objective(self, name: str) -> Objective:
    return next(o for o in self.objectives if o.name == name)


# family name -> the module defining FAMILY. Every module is imported on
# first use of the registry, so what is known never depends on import order.
MODULES = {
    "bert": "bert_jax.families.bert",
    "albert": "bert_jax.families.albert",
    "electra": "bert_jax.families.electra",
    "distilbert": "bert_jax.families.distilbert",
    "modernbert": "bert_jax.families.modernbert",
    "roberta": "bert_jax.families.roberta",
    "xlm-roberta": "bert_jax.families.xlm_roberta",
}


def all_families() -> dict[str, Family]:
  """Every family, by name."""
  return {name: importlib.import_module(module).FAMILY
          for name, module in MODULES.items()}


def names() -> tuple[str, ...]:
  return tuple(MODULES)


def get(name: str) -> Family:
  """The family `name` (a ValueError lists the others)."""
  if name not in MODULES:
    raise ValueError(f"No encoder family {name!r}; known: "
                     f"{', '.join(MODULES)}.")
  return all_families()[name]


def pretraining_objectives() -> dict[str, Family]:
  """Pretraining objective name -> its family."""
  return {o.name: f for f in all_families().values() for o in f.objectives}


def of_objective(name: str) -> Family:
  """The family a pretraining objective trains (ValueError naming the
  known objectives)."""
  owners = pretraining_objectives()
  if name not in owners:
    raise ValueError(f"objective.name={name!r} is not a pretraining "
                     f"objective ({', '.join(map(repr, owners))}).")
  return owners[name]


def objective(name: str) -> Objective:
  """The pretraining objective `name` (ValueError naming the known ones)."""
  return of_objective(name).objective(name)


def by_model_type(model_type: str) -> Family:
  """The family of a config.json model_type (ValueError naming the known
  ones)."""
  if model_type in MODULES:
    return get(model_type)
  raise ValueError(f"config.json model_type={model_type!r}: bert_jax reads "
                   f"{', '.join(map(repr, MODULES))}.")


def default_hf_models(config, params) -> tuple:
  """A pretraining run as its family's first pretraining class, with its
  model config (the export of every family but ELECTRA's pair and
  DistilBERT's student)."""
  table = of_objective(config.objective.name).pretraining_tables[0]
  return (checkpoint_io.HFModel("", table, config.model, params),)
