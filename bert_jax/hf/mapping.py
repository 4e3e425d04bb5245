"""Parameter-name tables, one per model family, read in both directions.

Our module tree mirrors the Hugging Face classes (see ``model.py``), so
conversion is renaming plus a transpose of dense kernels. Export
(:func:`to_hf_state_dict`) and import (:func:`from_hf_state_dict`) read the
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
row is the encoder layer index; our dense kernels are (in, out), HF Linear
weights (out, in), Google's TF kernels (in, out) except a few.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
from flax import nnx


class Row(NamedTuple):
  ours: str  # our dotted param path, "{i}" = layer index
  hf: str  # Hugging Face state-dict name
  tf: str  # Google TF checkpoint variable name ("" if none)
  transpose_hf: bool  # ours.T == hf
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

  def table(self, num_layers: int) -> list[Row]:
    """The rows with "{i}" expanded for `num_layers` encoder layers."""
    out = []
    for r in self.rows:
      if "{i}" in r.ours:
        out += [Row(*(f.format(i=i) if isinstance(f, str) else f for f in r))
                for i in range(num_layers)]
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
    "bert_classify": "bert_jax.hf.bert",
    "bert_token_classify": "bert_jax.hf.bert",
    "bert_qa": "bert_jax.hf.bert",
    "albert": "bert_jax.hf.families",
    "distilbert": "bert_jax.hf.families",
    "electra_discriminator": "bert_jax.hf.electra",
    "electra_generator": "bert_jax.hf.electra",
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
        arch) and fam.model_type == model_type:
      return fam
  return get(model_type) if model_type in TABLE_MODULES else get()


def by_model_type(model_type: str) -> Family:
  """The family whose config.json says model_type=`model_type`."""
  for fam in families().values():
    if fam.model_type == model_type:
      return fam
  raise ValueError(f"config.json model_type={model_type!r}: only "
                   f"{sorted(f.model_type for f in families().values())} "
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
    x = f32(flat[r.ours])
    sd[r.hf] = np.ascontiguousarray(x.T) if r.transpose_hf else x
  if include_tied:
    for tied, src in fam.tied.items():
      sd[tied] = sd[src].copy()
  return sd


# --------------------------------------------------------------------------
# Import: HF or Google TF names -> our tree
# --------------------------------------------------------------------------
@dataclasses.dataclass
class ImportReport:
  """What an import did: what was loaded, initialized fresh, or skipped."""
  source: str = ""
  format: str = ""  # "safetensors", "pytorch_bin", "tf_checkpoint", "bert_jax"
  architecture: str = ""  # BertForPreTraining / BertForMaskedLM / BertModel
  loaded: list = dataclasses.field(default_factory=list)  # our paths
  fresh: list = dataclasses.field(default_factory=list)  # our head prefixes
  skipped: list = dataclasses.field(default_factory=list)  # source keys
  notes: list = dataclasses.field(default_factory=list)

  def summary(self) -> str:
    lines = [f"Imported {len(self.loaded)} tensors from {self.source} "
             f"({self.format}, {self.architecture or 'unknown architecture'})."]
    if self.fresh:
      lines.append("Initialized fresh (absent from the source): "
                   + ", ".join(self.fresh) + ".")
    if self.skipped:
      shown = ", ".join(self.skipped[:8])
      more = f" (+{len(self.skipped) - 8} more)" if len(self.skipped) > 8 else ""
      lines.append(f"Skipped {len(self.skipped)} source keys: {shown}{more}.")
    lines += self.notes
    return "\n".join(lines)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  def __str__(self) -> str:
    return self.summary()


# Keys that are buffers, not parameters, in some HF checkpoints.
_HF_BUFFERS = re.compile(r"(^|\.)(position_ids|token_type_ids)$")
# Google TF checkpoint entries that are training state, not weights.
TF_TRAINING_STATE = re.compile(
    r"(/adam_[mv]$|/Adam(_1)?$|/LAMB(_1)?$|^global_step$|_power$)")


def canonical_hf_name(name: str, fam: Family, known) -> str:
  """Map the naming variants of HF checkpoints onto the table's names."""
  for prefix in ("module.", "model."):
    if name.startswith(prefix):
      name = name[len(prefix):]
  # Old PyTorch checkpoints name LayerNorm params gamma/beta.
  name = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", name)
  name = re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name)
  # Checkpoints of the bare model (BertModel) omit the base prefix.
  if fam.base_prefix and name not in known and fam.base_prefix + name in known:
    name = fam.base_prefix + name
  return name


def _layer_patterns(fam: Family) -> list[re.Pattern]:
  """Regexes of the per-layer names (HF and TF), any layer index."""
  pats = []
  for r in fam.rows:
    for name in (r.hf, r.tf):
      if "{i}" in name:
        pre = name.split("{i}")[0]
        if fam.base_prefix and pre.startswith(fam.base_prefix):
          pre = pre[len(fam.base_prefix):]
        pats.append(re.compile(re.escape(pre) + r"\d+"))
  return pats


def _fresh_params(fam: Family, model_config, seed: int) -> dict:
  m = fam.make_model(model_config, nnx.Rngs(seed))
  flat = flatten_params(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  return {k: np.asarray(v, np.float32) for k, v in flat.items()}


def expected_shapes(model_config, family: str = "bert") -> dict[str, tuple]:
  fam = get(family)
  abstract = nnx.eval_shape(lambda: fam.make_model(model_config, nnx.Rngs(0)))
  flat = flatten_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
  return {k: tuple(v.shape) for k, v in flat.items()}


def from_hf_state_dict(state_dict: Mapping[str, Any], model_config, *,
                       family: str = "bert", seed: int = 0, source: str = "",
                       fmt: str = "") -> tuple[dict, ImportReport]:
  """{HF (any class of the family) or Google TF name: array} -> (tree, report).

  Heads missing from the source are initialized fresh (seeded) and listed in
  the report; keys we have no use for are listed as skipped; optimizer slots
  and global_step of TF checkpoints are skipped silently (counted in a note).
  Raises ValueError naming the tensor and the config field on a shape mismatch.
  """
  fam = get(family)
  n_layers = int(model_config[fam.blocks_field])
  rows = fam.table(n_layers)
  by_hf = {r.hf: (r.ours, r.transpose_hf) for r in rows}
  by_tf = {r.tf: (r.ours, r.transpose_tf) for r in rows if r.tf}
  known = set(by_hf) | set(fam.tied)
  report = ImportReport(source=source, format=fmt)

  found: dict[str, np.ndarray] = {}
  seen_hf: dict[str, np.ndarray] = {}
  hf_names = []
  n_training_state = 0
  dtypes = set()
  for name, value in state_dict.items():
    if "/" in name or name == "global_step":  # Google TF checkpoint naming.
      if TF_TRAINING_STATE.search(name):
        n_training_state += 1
        continue
      if name not in by_tf:
        report.skipped.append(name)
        continue
      ours, transpose = by_tf[name]
    else:
      hf_name = canonical_hf_name(name, fam, known)
      hf_names.append(hf_name)
      if _HF_BUFFERS.search(hf_name):
        continue
      if hf_name in fam.tied:
        seen_hf[hf_name] = np.asarray(value)
        continue
      if hf_name not in by_hf:
        report.skipped.append(name)
        continue
      ours, transpose = by_hf[hf_name]
      seen_hf[hf_name] = np.asarray(value)
    arr = np.asarray(value)
    dtypes.add(str(arr.dtype))
    arr = f32(arr)
    found[ours] = np.ascontiguousarray(arr.T) if transpose else arr
  for tied, src in fam.tied.items():
    if tied not in seen_hf:
      continue
    if src not in seen_hf and src in by_hf:  # Some exports carry only the copy.
      ours, transpose = by_hf[src]
      arr = f32(seen_hf[tied])
      found[ours] = np.ascontiguousarray(arr.T) if transpose else arr
    elif src in seen_hf and not np.array_equal(
        np.asarray(seen_hf[tied], np.float32),
        np.asarray(seen_hf[src], np.float32)):
      raise ValueError(f"{tied} differs from {src}: this model ties them, an "
                       "untied checkpoint cannot be imported.")

  patterns = _layer_patterns(fam)
  stray = [k for k in report.skipped if any(p.search(k) for p in patterns)]
  if stray:
    raise ValueError(
        f"The source has encoder layers beyond model.{fam.blocks_field}="
        f"{n_layers} (e.g. {stray[0]}); set {fam.blocks_field} to match.")

  shapes = expected_shapes(model_config, family)
  for ours, arr in found.items():
    if tuple(arr.shape) != shapes[ours]:
      field = fam.shape_field(ours)
      raise ValueError(
          f"{ours}: the source has shape {tuple(arr.shape)}, this model config "
          f"expects {shapes[ours]}; check model.{field}="
          f"{model_config[field]}.")

  missing = sorted(set(shapes) - set(found))
  if missing:
    non_head = [m for m in missing
                if not any(m.startswith(h) for h in fam.heads)]
    if non_head:
      raise ValueError(f"The source lacks encoder weights: {non_head[:5]}.")
    fresh = _fresh_params(fam, model_config, seed)
    for m in missing:
      found[m] = fresh[m]
    report.fresh = sorted({h for h in fam.heads for m in missing
                           if m.startswith(h)})
    partial = [h for h in report.fresh
               if any(k.startswith(h) for k in found if k not in missing)]
    if partial:
      report.notes.append(f"Heads only partly present in the source, "
                          f"completed fresh: {partial}.")
  report.loaded = sorted(k for k in found if k not in set(missing))
  names = hf_names or [r.hf for r in rows
                       if r.ours in found and r.ours not in missing]
  report.architecture = next(
      (cls for prefix, cls in fam.architectures
       if any(n.startswith(prefix) for n in names)), fam.default_architecture)
  if n_training_state:
    report.notes.append(f"Skipped {n_training_state} optimizer slots / "
                        "global_step entries of the TF checkpoint.")
  if dtypes - {"float32"}:
    report.notes.append(f"Source dtype(s) {sorted(dtypes)} cast to float32.")
  return unflatten_params(found), report


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

