"""Import: a Hugging Face or Google TF state dict -> our param tree, by a
table (``mapping.Table``), with a report of what was loaded, initialized
fresh or skipped. The export direction is ``mapping``'s."""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import numpy as np
from flax import nnx

from bert_jax.hf import mapping
from bert_jax.hf.mapping import Table


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


def canonical_hf_name(name: str, fam: Table, known) -> str:
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


def _layer_patterns(fam: Table) -> list[re.Pattern]:
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


def _fresh_params(fam: Table, model_config, seed: int) -> dict:
  m = fam.make_model(model_config, nnx.Rngs(seed))
  flat = mapping.flatten_params(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  return {k: np.asarray(v, np.float32) for k, v in flat.items()}


def expected_shapes(model_config, table: Table) -> dict[str, tuple]:
  abstract = nnx.eval_shape(lambda: table.make_model(model_config,
                                                     nnx.Rngs(0)))
  flat = mapping.flatten_params(nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
  return {k: tuple(v.shape) for k, v in flat.items()}


def from_hf_state_dict(state_dict: Mapping[str, Any], model_config,
                       table: Table, *, seed: int = 0, source: str = "",
                       fmt: str = "") -> tuple[dict, ImportReport]:
  """{HF (any class the table reads) or Google TF name: array} -> (tree,
  report).

  Heads missing from the source are initialized fresh (seeded) and listed in
  the report; keys we have no use for are listed as skipped; optimizer slots
  and global_step of TF checkpoints are skipped silently (counted in a note).
  Raises ValueError naming the tensor and the config field on a shape mismatch.
  """
  fam = table
  n_layers = int(model_config[fam.blocks_field])
  rows = fam.expand(n_layers)
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
    found[ours] = mapping.from_hf_layout(mapping.f32(arr), transpose)
  for tied, src in fam.tied.items():
    if tied not in seen_hf:
      continue
    if src not in seen_hf and src in by_hf:  # Some exports carry only the copy.
      ours, transpose = by_hf[src]
      found[ours] = mapping.from_hf_layout(mapping.f32(seen_hf[tied]), transpose)
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

  shapes = expected_shapes(model_config, table)
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
  return mapping.unflatten_params(found), report


