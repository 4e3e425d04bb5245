"""Parameter-name tables, read in both directions.

A :class:`Table` lists one Hugging Face class's parameters: our dotted path,
its Hugging Face name, its Google TF name, and how the arrays differ
(transposed, or a :class:`Layout`). Our module trees mirror the Hugging
Face classes (``bert_jax/models/``), so conversion is renaming plus a
transpose of dense kernels. Export (:func:`to_hf_state_dict`) and import
(``hf/importing.py``) read the same table; nothing here branches on a
family. numpy only: no torch, no TensorFlow, no mesh (flax only to build
fresh heads).

The tables themselves belong to the families (``bert_jax/families/``): each
declares its pretraining classes and its bare encoder; ``bert_jax.compose``
derives the table of any family's encoder with any task kind's head.

Table format: ``{i}`` in a row is the encoder layer index, from 0 or from
the row's ``Table.first_layer`` (ModernBERT has no attention norm before
block 0); our dense kernels are (in, out), HF Linear weights (out, in),
Google's TF kernels (in, out) except a few. Instead of a transpose flag a
row may name a :class:`Layout`: a fused kernel stored with its parts on an
axis of their own (ModernBERT's Wqkv as [in, 3, out]) that HF keeps as one
Linear weight [3 out, in].
"""

from __future__ import annotations

import dataclasses
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
class Table:
  """Everything name-related about one Hugging Face class (or a family of
  classes sharing an encoder, e.g. BertForPreTraining / ForMaskedLM /
  BertModel, which differ only in the heads present)."""
  name: str  # e.g. "bert", "bert_sentence": named in messages
  model_type: str  # config.json model_type
  rows: tuple[Row, ...]
  make_model: Callable  # (model_config, rngs) -> nnx module with our tree
  # config.json both ways: (model_config, pad_token_id) -> dict (naming
  # export_architecture), and dict -> our model config.
  config_to_hf: Callable
  config_from_hf: Callable
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
  # named in shape-mismatch errors: the table's own, read after the shared
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
  # HF prefixes trained only by the sentence-pair objective (NSP / SOP):
  # flagged as untrained when a run had none.
  sentence_heads: tuple[str, ...] = ()
  # (model_config, label_names) -> extra config.json entries, or None.
  config_fields: Callable | None = None
  # Model config field counting the "{i}" blocks (ALBERT: its shared groups).
  blocks_field: str = "num_hidden_layers"
  # "{i}" rows (our path) that start at a later layer than 0.
  first_layer: Mapping[str, int] = dataclasses.field(default_factory=dict)

  def expand(self, num_layers: int) -> list[Row]:
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
# every table (each adds its own in Table.shape_fields).
SHAPE_FIELDS = {"word_embeddings": "vocab_size", "mlm_head.bias": "vocab_size",
                "position_embeddings": "max_position_embeddings",
                "token_type_embeddings": "type_vocab_size",
                "intermediate": "intermediate_size"}


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


def num_layers_of(params: Mapping[str, Any], table: Table) -> int:
  prefix = table.layer_prefix()
  idx = {int(k[len(prefix):].split(".")[0])
         for k in flatten_params(params) if k.startswith(prefix)}
  return max(idx) + 1 if idx else 0


def f32(x) -> np.ndarray:
  return np.ascontiguousarray(np.asarray(x).astype(np.float32))


# --------------------------------------------------------------------------
# Export: our tree -> HF names
# --------------------------------------------------------------------------
def to_hf_state_dict(params: Mapping[str, Any], table: Table, *,
                     include_tied: bool = True) -> dict[str, np.ndarray]:
  """Our param tree -> {HF name: float32 numpy array}.

  Always float32, whatever the compute dtype was. With `include_tied`, tied
  copies (BERT's MLM decoder weight/bias) are written explicitly.
  """
  flat = flatten_params(params)
  rows = [r for r in table.expand(num_layers_of(params, table))
          if r.ours in flat or not any(o in r.ours for o in table.optional)]
  expected = {r.ours for r in rows}
  extra = sorted(set(flat) - expected)
  missing = sorted(expected - set(flat))
  if extra or missing:
    raise ValueError(f"Param tree does not match the {table.name} table: missing "
                     f"{missing[:5]}, unexpected {extra[:5]}.")
  sd = {}
  for r in rows:
    sd[r.hf] = _to_hf(f32(flat[r.ours]), r.transpose_hf)
  if include_tied:
    for tied, src in table.tied.items():
      sd[tied] = sd[src].copy()
  return sd


def make_model(params: Mapping[str, Any], model_config, table: Table, *,
               dtype: str | None = "float32"):
  """An nnx model of the table's class holding `params` (no random init is
  run).

  `dtype` overrides the compute dtype (float32 for exact comparisons; None
  keeps model_config.dtype).
  """
  cfg = model_config.copy_and_resolve_references()
  if dtype is not None:
    cfg.dtype = dtype
  abstract = nnx.eval_shape(lambda: table.make_model(cfg, nnx.Rngs(0)))
  graphdef, state, rest = nnx.split(abstract, nnx.Param, ...)
  pure = unflatten_params({k: np.asarray(v, np.float32)
                           for k, v in flatten_params(params).items()})
  nnx.replace_by_pure_dict(state, pure)
  return nnx.merge(graphdef, state, rest)

