"""Parameter-name tables, one per model family, read in both directions.

Our module tree mirrors the Hugging Face classes (``bert_jax/models/``), so
conversion is renaming plus a transpose of dense kernels. Export
(:func:`to_hf_state_dict`) and import (``hf/importing.py``) read the
same :class:`Family` table; nothing here branches on the family name. numpy
only: no torch, no TensorFlow, no mesh (flax only to build fresh heads).

Adding a family (ELECTRA, ALBERT, DistilBERT, ...) is one call::

  mapping.register(mapping.Family(
      name="electra", model_type="electra", make_model=...,
      rows=(Row("electra.embeddings.word_embeddings",
                "electra.embeddings.word_embeddings.weight",
                "electra/embeddings/word_embeddings", False, False), ...),
      tied={...}, heads={...}, architectures=(...), base_prefix="electra."))

Table format: each :class:`Row` is (our dotted path, HF name, Google TF name,
transpose between ours and HF, transpose between ours and TF). ``{i}`` in a
row is the encoder layer index, from 0 or from the row's
``Family.first_layer`` (ModernBERT has no attention norm before block 0);
our dense kernels are (in, out), HF Linear weights (out, in), Google's TF
kernels (in, out) except a few. Instead of a transpose flag a row may name
a :class:`Layout`: a fused kernel stored with its parts on an axis of their
own (ModernBERT's Wqkv as [in, 3, out]) that HF keeps as one Linear weight
[3 out, in].
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
from flax import nnx


class Layout(NamedTuple):
  """How ours and HF store one tensor, when it is more than a transpose."""
  to_hf: Callable[[np.ndarray], np.ndarray]
  from_hf: Callable[[np.ndarray], np.ndarray]


def split_linear(parts: int) -> Layout:
  """Ours [in, parts, out] <-> HF Linear weight [parts * out, in], the
  parts in order along HF's output dim (q, k, v; GeGLU's input, gate)."""
  return Layout(
      to_hf=lambda k: k.reshape(k.shape[0], -1).T,
      from_hf=lambda w: w.T.reshape(w.shape[1], parts, -1))


def _to_hf(x, how):
  if isinstance(how, Layout):
    return np.ascontiguousarray(how.to_hf(x))
  return np.ascontiguousarray(x.T) if how else x


def from_hf_layout(x, how):
  if isinstance(how, Layout):
    return np.ascontiguousarray(how.from_hf(x))
  return np.ascontiguousarray(x.T) if how else x


class Row(NamedTuple):
  ours: str  # our dotted param path, "{i}" = layer index
  hf: str  # Hugging Face state-dict name
  tf: str  # Google TF checkpoint variable name ("" if none)
  transpose_hf: bool | Layout  # ours.T == hf (or the Layout between them)
  transpose_tf: bool  # ours.T == tf


@dataclasses.dataclass(frozen=True)
class Family:
  """Everything name-related about one model family's HF checkpoints."""
  name: str  # registry key, e.g. "bert"
  model_type: str  # config.json model_type
  rows: tuple[Row, ...]
  make_model: Callable  # (model_config, rngs) -> nnx module with our tree
  # HF keys that are copies of other HF keys (tied weights): written on
  # export; on import checked against their source, or used when only the
  # copy is present.
  tied: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # Our path prefix -> HF name prefix of heads a source may lack (filled
  # fresh on import and listed in the report).
  heads: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # (HF name prefix present -> class name), first match wins; else default.
  architectures: tuple[tuple[str, str], ...] = ()
  default_architecture: str = ""
  # HF base-model prefix ("bert."): checkpoints of the bare model omit it.
  base_prefix: str = ""
  # Our path fragment -> the model config field that sets that dimension,
  # named in shape-mismatch errors: the family's own, read after the shared
  # SHAPE_FIELDS (see :meth:`shape_field`).
  shape_fields: Mapping[str, str] = dataclasses.field(default_factory=dict)
  # Our path fragments of rows that a model config may lack (ELECTRA's
  # E -> H projection when E == H): written only when the params have them.
  optional: tuple[str, ...] = ()
  # Whether the model returns masked-LM logits ("mlm_logits"): the models
  # fill_mask and zero_shot can run.
  masked_lm: bool = False
  # The class written to config.json "architectures" on export.
  export_architecture: str = ""
  # The training objective (`bert_jax.objectives` name) whose params this
  # table describes, both ways: a Hugging Face directory of the family is
  # that objective's run (``pretrained.resolve``), and a run of it exports
  # as the family unless its objective says otherwise
  # (:func:`for_objective`). () for the halves of ELECTRA's pair.
  objectives: tuple[str, ...] = ()
  # (our model config) -> fields of that objective's config group a run
  # holding these params has (DistilBERT: student_layers), or None.
  objective_fields: Callable | None = None
  # HF prefixes trained only by the sentence-pair objective (NSP / SOP):
  # flagged as untrained when a run had none.
  sentence_heads: tuple[str, ...] = ()
  # (model_config, label_names) -> extra config.json entries, or None.
  config_fields: Callable | None = None
  # Model config field counting the "{i}" blocks (ALBERT: its shared groups).
  blocks_field: str = "num_hidden_layers"
  # Config.json conversion for families whose config is not BertConfig:
  # (model_config, pad_token_id) -> dict, and dict -> our model config.
  config_to_hf: Callable | None = None
  config_from_hf: Callable | None = None
  # "{i}" rows (our path) that start at a later layer than 0.
  first_layer: Mapping[str, int] = dataclasses.field(default_factory=dict)
  # (config.json dict) -> whether this table reads a directory of its class
  # with that config (None: every one); else the model_type's table does.
  reads: Callable | None = None

  def table(self, num_layers: int) -> list[Row]:
    """The rows with "{i}" expanded for `num_layers` encoder layers."""
    out = []
    for r in self.rows:
      if "{i}" in r.ours:
        out += [Row(*(f.format(i=i) if isinstance(f, str) else f for f in r))
                for i in range(self.first_layer.get(r.ours, 0), num_layers)]
      else:
        out.append(r)
    return out

  def shape_field(self, ours: str) -> str:
    """The model config field that sets a dimension of param `ours`."""
    fields = {**SHAPE_FIELDS, **self.shape_fields}
    return next((f for k, f in fields.items() if k in ours), "hidden_size")

  def layer_prefix(self) -> str:
    """Our path before the layer index, e.g. "bert.layers."."""
    return next(r.ours for r in self.rows if "{i}" in r.ours).split("{i}")[0]


# Our path fragment -> the model config field of that dimension, shared by
# every family (each adds its own in Family.shape_fields).
SHAPE_FIELDS = {"word_embeddings": "vocab_size", "mlm_head.bias": "vocab_size",
                "position_embeddings": "max_position_embeddings",
                "token_type_embeddings": "type_vocab_size",
                "intermediate": "intermediate_size"}


# Every family table and the module that defines it: the one registry. A
# table is read from its module on first use, so what is known never depends
# on which modules some caller happened to import before.
TABLE_MODULES = {
    "bert": "bert_jax.hf.bert",
    "albert": "bert_jax.hf.families",
    "distilbert": "bert_jax.hf.families",
    "electra_discriminator": "bert_jax.hf.electra",
    "electra_generator": "bert_jax.hf.electra",
    "modernbert": "bert_jax.hf.modernbert",
    "modernbert_classify": "bert_jax.hf.modernbert",
    "modernbert_token_classify": "bert_jax.hf.modernbert",
    "modernbert_qa": "bert_jax.hf.modernbert",
    # Fine-tuned classifiers, one per encoder family.
    "bert_classify": "bert_jax.hf.classify",
    "albert_classify": "bert_jax.hf.classify",
    "electra_classify": "bert_jax.hf.classify",
    "distilbert_classify": "bert_jax.hf.classify",
    # Fine-tuned token taggers and extractive QA heads, the same families.
    "bert_token_classify": "bert_jax.hf.classify",
    "bert_qa": "bert_jax.hf.classify",
    "albert_token_classify": "bert_jax.hf.classify",
    "albert_qa": "bert_jax.hf.classify",
    "electra_token_classify": "bert_jax.hf.classify",
    "electra_qa": "bert_jax.hf.classify",
    "distilbert_token_classify": "bert_jax.hf.classify",
    "distilbert_qa": "bert_jax.hf.classify",
}
_LOADED: dict[str, Family] = {}


def register(family: Family) -> Family:
  """Called once per table by the module TABLE_MODULES names for it."""
  if TABLE_MODULES.get(family.name) is None:
    raise ValueError(f"Family {family.name!r} is not listed in "
                     "bert_jax.hf.mapping.TABLE_MODULES.")
  _LOADED[family.name] = family
  return family


def get(name: str = "bert") -> Family:
  if name not in TABLE_MODULES:
    raise ValueError(f"No Hugging Face table for model family {name!r}; "
                     f"known: {sorted(TABLE_MODULES)}.")
  if name not in _LOADED:
    importlib.import_module(TABLE_MODULES[name])
  return _LOADED[name]


def families() -> dict[str, Family]:
  """Every registered table, by name (all table modules loaded)."""
  return {name: get(name) for name in TABLE_MODULES}


def table(num_layers: int, family: str = "bert") -> list[Row]:
  return get(family).table(num_layers)


def for_objective(objective: str) -> Family:
  """The family whose params a run of `objective` trains: the one mapping
  from training objective to Hugging Face architecture."""
  for fam in families().values():
    if objective in fam.objectives:
      return fam
  raise ValueError(f"objective.name={objective!r} has no Hugging Face export "
                   f"table; exportable objectives: "
                   f"{sorted(o for f in families().values() for o in f.objectives)}.")


def for_hf_config(hf_config: Mapping[str, Any] | None) -> Family:
  """The family of an HF config.json: the one exporting (else, without a
  class of its own to export, reading) its first architecture, else the one
  named by its model_type (default BERT)."""
  hf_config = hf_config or {}
  arch = (hf_config.get("architectures") or [""])[0]
  model_type = hf_config.get("model_type", "bert")
  for fam in families().values():
    if arch and (fam.export_architecture or fam.default_architecture) == (
        arch) and fam.model_type == model_type and (
            fam.reads is None or fam.reads(hf_config)):
      return fam
  return get(model_type) if model_type in TABLE_MODULES else get()


def by_model_type(model_type: str) -> Family:
  """The family whose config.json says model_type=`model_type`."""
  for fam in families().values():
    if fam.model_type == model_type:
      return fam
  raise ValueError(f"config.json model_type={model_type!r}: only "
                   f"{sorted({f.model_type for f in families().values()})} "
                   "checkpoints can be imported.")


# --------------------------------------------------------------------------
# Param trees
# --------------------------------------------------------------------------
def flatten_params(params: Mapping[str, Any]) -> dict[str, Any]:
  """Nested dict (int or str layer keys) -> {"bert.layers.0.attention...": leaf}."""
  flat = {}

  def visit(prefix, node):
    if isinstance(node, Mapping) or hasattr(node, "items") and not hasattr(
        node, "shape"):
      for k, v in node.items():
        visit(f"{prefix}.{k}" if prefix else str(k), v)
    else:
      flat[prefix] = node

  visit("", params)
  return flat


def unflatten_params(flat: Mapping[str, Any]) -> dict[str, Any]:
  """Inverse of flatten_params; numeric keys become ints (as nnx.List uses)."""
  tree: dict = {}
  for path, leaf in flat.items():
    node = tree
    parts = [int(p) if p.isdigit() else p for p in path.split(".")]
    for p in parts[:-1]:
      node = node.setdefault(p, {})
    node[parts[-1]] = leaf
  return tree


def num_layers_of(params: Mapping[str, Any], family: str = "bert") -> int:
  prefix = get(family).layer_prefix()
  idx = {int(k[len(prefix):].split(".")[0])
         for k in flatten_params(params) if k.startswith(prefix)}
  return max(idx) + 1 if idx else 0


def f32(x) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x).astype(np.float32))


# --------------------------------------------------------------------------
# Export: our tree -> HF names
# --------------------------------------------------------------------------
def to_hf_state_dict(params: Mapping[str, Any], *, family: str = "bert",
                     include_tied: bool = True) -> dict[str, np.ndarray]:
  """Our param tree -> {HF name: float32 numpy array}.

  Always float32, whatever the compute dtype was. With `include_tied`, tied
  copies (BERT's MLM decoder weight/bias) are written explicitly.
  """
  fam = get(family)
  flat = flatten_params(params)
  rows = [r for r in fam.table(num_layers_of(params, family))
          if r.ours in flat or not any(o in r.ours for o in fam.optional)]
  expected = {r.ours for r in rows}
  extra = sorted(set(flat) - expected)
  missing = sorted(expected - set(flat))
  if extra or missing:
    raise ValueError(f"Param tree does not match the {family} table: missing "
                     f"{missing[:5]}, unexpected {extra[:5]}.")
  sd = {}
  for r in rows:
    sd[r.hf] = _to_hf(f32(flat[r.ours]), r.transpose_hf)
  if include_tied:
    for tied, src in fam.tied.items():
      sd[tied] = sd[src].copy()
  return sd


def make_model(params: Mapping[str, Any], model_config, *,
               family: str = "bert", dtype: str | None = "float32"):
  """An nnx model of the family holding `params` (no random init is run).

  `dtype` overrides the compute dtype (float32 for exact comparisons; None
  keeps model_config.dtype).
  """
  fam = get(family)
  cfg = model_config.copy_and_resolve_references()
  if dtype is not None:
    cfg.dtype = dtype
  abstract = nnx.eval_shape(lambda: fam.make_model(cfg, nnx.Rngs(0)))
  graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
  pure = unflatten_params({k: np.asarray(v, np.float32)
                           for k, v in flatten_params(params).items()})
  nnx.replace_by_pure_dict(state, pure)
  return nnx.merge(graphdef, state, rest)

