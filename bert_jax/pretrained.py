"""What is at this path, and how to load params, model config and tokenizer.

The one place every entry point (trainer ``train.init_from``, ``fill_mask``,
the converters, fine-tuning) asks. Kinds of path:

  workdir    a pretraining workdir (its latest committed step, or `step`)
  step       one ``WORKDIR/checkpoints/<step>`` directory
  imported   a tools/convert_from_hf.py output (params.safetensors)
  hf         a Hugging Face directory (config.json + safetensors / .bin);
             with sentence-transformers modules (modules.json), an
             embedding model
  tf         a Google TF checkpoint (bert_config.json + *.index)
  electra    an ELECTRA pair: discriminator/ and generator/ Hugging Face
             directories (``bert_jax.families.electra``), loaded into the whole
             ELECTRA tree (both networks)

  source = pretrained.resolve(path, step=None)
  source.objective      # "bert", "electra", ...: decided here, only here
  model_config = pretrained.load_model_config(source)
  params, report = pretrained.load_params(source, model_config)
  spec = pretrained.tokenizer_spec(source)

Provenance: the objective that trained the params and the completed run
config they belong to (:class:`Source`), read from a run's stored config or
implied by a Hugging Face directory's config.json (its class names a
family's pretraining run or a task kind's head on a family's encoder:
``compose.hf_directory``). What a run makes of them (its Hugging Face
models, the encoder a task head or embeddings take, the masked LM
fill-mask runs) is ``bert_jax.compose``'.

A workdir's tokenizer is the one its run recorded (:func:`record_tokenizer`,
``WORKDIR/tokenizer/record.json``); workdirs written before the record existed
are searched (:func:`_search_old_workdir`). No TensorFlow and no torch are
imported except to read a TF checkpoint / pytorch_model.bin or to write the
record on a ``gs://`` workdir.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
from typing import Any

import jax
import ml_collections
from etils import epath

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import families
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.families import electra
from bert_jax.hf import checkpoint_io
from bert_jax.hf import importing
from bert_jax.hf import mapping
from bert_jax.hf import sentence_transformers
from bert_jax.hf import tokenizer_files
from bert_jax.hf import vocab

WORKDIR, STEP, IMPORTED, HF, TF = "workdir", "step", "imported", "hf", "tf"
ELECTRA = "electra"
TOKENIZER_RECORD = os.path.join("tokenizer", "record.json")


@dataclasses.dataclass(frozen=True)
class Source:
  """A resolved path: its kind, what was read to decide it, and its
  provenance: the run config its params belong to, so its objective."""
  kind: str  # WORKDIR, STEP, IMPORTED, HF, TF or ELECTRA
  path: str  # the path as resolved (absolute for local paths)
  step: int | None = None  # checkpoint step (workdir / step kinds)
  step_dir: str = ""  # checkpoints/<step> (workdir / step kinds)
  workdir: str = ""  # the run's workdir (workdir / step kinds)
  # The run config of the params, completed (``config_lib.complete``: the
  # defaults for what a stored config lacks; an ELECTRA config's
  # objective.temperature without generator_temperature read as
  # generator_temperature). A run's stored
  # config; for the other kinds the one their files imply (model from
  # config.json, objective from the family table). None only when the path
  # stores no model config (a weights file without config.json).
  config: Any = None
  # The table that reads the weights (HF and TF kinds); None for our own
  # formats (workdir, step, imported) and ELECTRA pairs (families.electra
  # reads both halves).
  table: mapping.Table | None = None

  @property
  def objective(self) -> str:
    """The objective (``bert_jax.objectives`` name) that trained the
    params; runs older than ``config.objective`` (and a bare weights file)
    have the default, BERT."""
    config = self.config if self.config is not None else config_lib.complete(
        {})
    return config.objective.name


def _abs(path: str) -> str:
  return path if "://" in path else os.path.abspath(path)


def _exists(path: str) -> bool:
  if "://" in path:
    return epath.Path(path).exists()
  return os.path.exists(path)


def _is_ours(path: str) -> bool:
  """A workdir, its checkpoints/ directory or one of its step directories."""
  p = epath.Path(path)
  return ((p / "checkpoints").is_dir() or p.name == "checkpoints" or
          (p.name.isdigit() and (p / "state").is_dir()))


def _run_config(objective: str, model_config, fields=None):
  """The completed run config of params of `objective` with `model_config`
  (and the objective's own `fields`, e.g. an ELECTRA generator's size)."""
  return config_lib.complete({"objective": dict(fields or {}, name=objective),
                              "model": model_config.to_dict()})


def _check_model_type(path: str, hf_config) -> None:
  """ValueError naming what a Hugging Face directory of another kind of
  model (GPT-2, T5, ...) is, before anything looks for BERT's files."""
  model_type = (hf_config or {}).get("model_type", "bert")
  if model_type not in families.names():
    arch = ", ".join((hf_config or {}).get("architectures") or ()) or "?"
    raise ValueError(
        f"{path} is a Hugging Face {model_type!r} model ({arch}), not an "
        "encoder bert_jax reads (model_type "
        f"{', '.join(map(repr, sorted(families.names())))}).")


def _hf_source(kind: str, path: str, hf_config) -> Source:
  """A Hugging Face directory or TF checkpoint: the table its class names
  and the run it implies (None without a config.json: Google's BERT with
  no model config); a sentence-transformers directory is an embedding
  run with its modules' pooling (``hf.sentence_transformers``)."""
  embedding = (sentence_transformers.read(path) if kind == HF and
               os.path.isdir(path) else None)
  try:
    table, run = compose.hf_directory(hf_config, embedding)
  except ValueError as e:
    raise ValueError(f"{path} {e}") from None
  config = config_lib.complete(run) if hf_config is not None else None
  return Source(kind, path, config=config, table=table)


def resolve(path: str, step: int | None = None) -> Source:
  """Decides what `path` is, and its provenance; FileNotFoundError naming
  it when it is nothing.

  `step` selects a checkpoint of a workdir (default: the latest committed).
  """
  if not path:
    raise FileNotFoundError("No path given (empty string).")
  path = _abs(path)
  if not _exists(path) and not os.path.exists(path + ".index"):
    raise FileNotFoundError(f"{path} does not exist.")
  if _is_ours(path):
    try:
      step_dir, chosen = checkpoint_reading.resolve_step_dir(path, step)
    except FileNotFoundError as e:
      if step is not None or "available: []" not in str(e):
        raise
      raise FileNotFoundError(
          f"{path} has no checkpoint yet (no committed checkpoints/<step>/): "
          "train until the first save (checkpoint.save_every_steps) or pass "
          "the workdir of a run that saved one.") from e
    workdir = os.path.dirname(os.path.dirname(step_dir))
    kind = STEP if os.path.basename(path).isdigit() else WORKDIR
    stored = checkpoint_reading.stored_config(step_dir) or {}
    config = config_lib.complete(stored) if "model" in stored else None
    if config is not None:
      # The phase the checkpoint was saved in may have changed the model's
      # function (context extension's RoPE base): that is the trained model.
      config.model.update(config_lib.phase_model_overrides(config, chosen))
    return Source(kind, path, chosen, step_dir, workdir, config)
  if step is not None:
    raise ValueError(f"{path} is not a training workdir: --step={step} "
                     "applies only to workdirs.")
  if os.path.isfile(os.path.join(path, checkpoint_io.IMPORTED_PARAMS)):
    return Source(IMPORTED, path, config=config_lib.complete(
        checkpoint_io.read_imported_config(path)))
  if electra.is_pair(path):
    return Source(ELECTRA, path,
                  config=_run_config("electra", *electra.read_pair_config(
                      path)))
  hf_config = checkpoint_io.read_hf_config(path)
  _check_model_type(path, hf_config)
  kind = None
  if path.endswith((".safetensors", ".bin")) and os.path.isfile(path) or (
      hf_config is not None and any(os.path.exists(os.path.join(path, f))
                                    for f in checkpoint_io.HF_WEIGHT_FILES)):
    kind = HF
  elif checkpoint_io.find_tf_checkpoint(path) is not None:
    kind = TF
  if kind is not None:
    return _hf_source(kind, path, hf_config)
  raise FileNotFoundError(
      f"{path} is none of: a training workdir (checkpoints/), a checkpoint "
      f"step directory, a tools/convert_from_hf.py output "
      f"({checkpoint_io.IMPORTED_PARAMS}), a Hugging Face directory "
      "(config.json + model.safetensors or pytorch_model.bin) or a TF "
      "checkpoint (*.index).")


def _as_source(source: Source | str) -> Source:
  return source if isinstance(source, Source) else resolve(source)


def load_model_config(source: Source | str) -> ml_collections.ConfigDict:
  """The model group of the source's run config (a copy): the architecture
  its params were made for."""
  source = _as_source(source)
  if source.config is None:
    if source.kind in (WORKDIR, STEP):
      raise FileNotFoundError(f"{source.path} stores no model config.")
    raise FileNotFoundError(f"No config.json or bert_config.json in "
                            f"{source.path}; it is needed for the model "
                            "config.")
  return ml_collections.ConfigDict(source.config.model.to_dict())


def check_fits(source: Source, model_config, field: str,
               note: str = "") -> None:
  """ValueError naming config `field` (which gave `source`) when its params
  are of another architecture than `model_config`, before anything loads
  them; fewer vocabulary rows are fine (an export trimmed to its tokenizer:
  :func:`load_params` pads them)."""
  if source.config is None:
    return
  theirs = ml_collections.ConfigDict(source.config.model.to_dict())
  theirs.vocab_size = max(int(theirs.vocab_size), int(model_config.vocab_size))
  checkpoint_io.check_same_architecture(theirs, model_config, source.path,
                                        field=field, note=note)


def load_params(source: Source | str, model_config=None, *,
                abstract_params=None, seed: int = 0, config=None):
  """Params of `source` for `model_config` -> (params, ImportReport).

  Without `abstract_params`: a nested dict of float32 numpy arrays (int layer
  keys, the layout of ``nnx.state(model, nnx.Param).to_pure_dict()``) holding
  every parameter of the model the source's objective trains (an ELECTRA
  source: both networks); heads an HF source lacks are initialized from
  `seed`. A caller whose model has other heads (fine-tuning) takes the
  subtrees it wants. With `abstract_params` (ShapeDtypeStructs with
  shardings) the result is global arrays on those shardings and must match
  their tree. A source with fewer vocabulary rows than `model_config` (an
  export trimmed to its tokenizer) is padded to it (``hf.vocab.pad``).
  Architecture fields must equal `model_config`'s (ValueError naming the
  field); `config` (the current run config) only improves the message when
  a checkpoint does not fit.
  """
  source = _as_source(source)
  if model_config is None:
    model_config = load_model_config(source)
  rows = int(model_config.vocab_size)
  if source.config is not None and int(source.config.model.vocab_size) < rows:
    # A table trimmed to its tokenizer (an export) into a padded config: the
    # source's rows, then rows that are no token (hf.vocab.pad).
    model_config = ml_collections.ConfigDict(model_config.to_dict())
    model_config.vocab_size = int(source.config.model.vocab_size)
    params, report = load_params(source, model_config, seed=seed,
                                 config=config)
    params = vocab.pad(params, rows, seed=seed, initializer_range=float(
        model_config.initializer_range))
    report.notes.append(
        f"Vocabulary padded from {model_config.vocab_size} to {rows} rows "
        "(the rows past the source's tokenizer are no token).")
    if abstract_params is not None:
      params = checkpoint_reading.place_params(params, abstract_params,
                                               source=source.path)
    return params, report
  if source.config is not None and not (
      source.kind in (WORKDIR, STEP) and abstract_params is not None):
    # (Restoring onto shardings compares the stored config with `config`.)
    checkpoint_io.check_same_architecture(source.config.model, model_config,
                                          source.path)
  if source.kind in (WORKDIR, STEP):
    report = importing.ImportReport(
        source=source.step_dir, format="bert_jax",
        architecture=f"{source.objective} run")
    if abstract_params is not None:  # Read straight onto the shardings.
      params, _ = checkpoint_reading.restore_params(
          source.step_dir, abstract_params, config=config)
    else:
      params, _, _ = checkpoint_reading.load_params(source.step_dir)
    report.loaded = sorted(mapping.flatten_params(params))
    return params, report
  if source.kind == IMPORTED:
    params, _, report = checkpoint_io.load_imported(source.path)
  elif source.kind == ELECTRA:
    if config is not None:
      electra.check_same_generator(source.config, config, source.path)
    params = electra.load_pair(source.path, source.config)
    report = importing.ImportReport(
        source=source.path, format="safetensors",
        architecture="ElectraForPreTraining + ElectraForMaskedLM",
        loaded=sorted(mapping.flatten_params(params)))
  else:
    params, report = checkpoint_io.load_hf_params(
        source.path, model_config, source.table, seed=seed)
  if abstract_params is not None:
    params = checkpoint_reading.place_params(params, abstract_params,
                                             source=source.path)
  return params, report


# --------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------
def record_tokenizer(workdir: str, tok) -> None:
  """Writes which tokenizer this run uses (process 0; tf.io.gfile paths).

  `tok`: a ``tokenizers.Tokenizer`` (kind, path, lower_case). The path is
  stored relative to the workdir when it lies inside it, so a copied or
  moved workdir still finds it.
  """
  if jax.process_index() != 0:
    return
  import tensorflow as tf  # The trainer has it loaded; gs:// needs it.
  root = workdir.rstrip("/") + "/"
  path = tok.path
  if "://" not in path:
    path = os.path.abspath(path)
    root = os.path.abspath(workdir) + os.sep if "://" not in workdir else root
  rel = path[len(root):] if path.startswith(root) else path
  record = dict(kind=tok.kind, path=rel, lower_case=bool(tok.lower_case))
  target = os.path.join(workdir, TOKENIZER_RECORD)
  tf.io.gfile.makedirs(os.path.dirname(target))
  with tf.io.gfile.GFile(target, "w") as f:
    f.write(json.dumps(record, indent=2) + "\n")


def read_text(path: str) -> str | None:
  """A text file (local or tf.io.gfile path), or None when absent."""
  if "://" in path:
    import tensorflow as tf  # Only gs:// and other remote workdirs need it.
    if not tf.io.gfile.exists(path):
      return None
    with tf.io.gfile.GFile(path) as f:
      return f.read()
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return f.read()


def _join(workdir: str, path: str) -> str:
  if "://" in path or os.path.isabs(path):
    return path
  return os.path.join(workdir, path)


def recorded_tokenizer(workdir: str) -> tokenizer_files.TokenizerSpec | None:
  """The tokenizer a run in `workdir` recorded (:func:`record_tokenizer`),
  or None when it recorded none (not started yet, or older than records)."""
  text = read_text(os.path.join(workdir, TOKENIZER_RECORD))
  if text is None:
    return None
  rec = json.loads(text)
  return tokenizer_files.TokenizerSpec(
      rec["kind"], _join(workdir, rec["path"]), bool(rec["lower_case"]))


def tokenizer_spec(source: Source | str) -> tokenizer_files.TokenizerSpec:
  """The tokenizer the source's params were trained with (file + settings)."""
  source = _as_source(source)
  spec = tokenizer_files.TokenizerSpec
  if source.kind in (WORKDIR, STEP):
    recorded = recorded_tokenizer(source.workdir)
    if recorded is None:
      return _search_old_workdir(source.workdir, source.config)
    return recorded
  directory = _tokenizer_dir(source)
  lower = True
  cfg_path = os.path.join(directory, "tokenizer_config.json")
  if os.path.isfile(cfg_path):
    with open(cfg_path) as f:
      lower = bool(json.load(f).get("do_lower_case", True))
  if source.kind == IMPORTED:  # What tools/convert_from_hf.py recorded.
    data = checkpoint_io.read_imported_config(source.path).get("data") or {}
    lower = bool(data.get("lower_case", lower))
  for name, kind in (("vocab.txt", "wordpiece"), ("spiece.model",
                                                   "sentencepiece")):
    if os.path.isfile(os.path.join(directory, name)):
      return spec(kind, os.path.join(directory, name), lower)
  # Else its tokenizer.json (RoBERTa's, XLM-R's, ModernBERT's BPE: they
  # ship no other file bert_jax reads; XLM-R's sentencepiece.bpe.model
  # gives ids one below its tokenizer.json's), run host-side.
  tokenizer_json = os.path.join(directory, "tokenizer.json")
  if not os.path.isfile(tokenizer_json):
    raise FileNotFoundError(f"No vocab.txt, spiece.model or tokenizer.json "
                            f"in {directory}.")
  return spec("hf_json", tokenizer_json, lower)


def _tokenizer_dir(source: Source) -> str:
  """Where a source that is not a workdir keeps its tokenizer files (an
  ELECTRA pair: in each half, the same files)."""
  if source.kind == ELECTRA:
    return os.path.join(source.path, electra.DISCRIMINATOR)
  return source.path


def load_tokenizer(source: Source | str) -> tokenizer_files.LoadedTokenizer:
  """A `tokenizers` tokenizer for the source (HF files when it has them)."""
  source = _as_source(source)
  if source.kind in (WORKDIR, STEP):
    spec = tokenizer_spec(source)
    names = tokenizer_files.special_token_names(spec)
    return tokenizer_files.LoadedTokenizer(
        tokenizer_files.build_hf_tokenizer(spec),
        mask_token=names.get("mask_token", "[MASK]"),
        pad_token=names.get("pad_token", "[PAD]"))
  return tokenizer_files.load_hf_tokenizer(_tokenizer_dir(source))


def _search_old_workdir(workdir: str, config) -> tokenizer_files.TokenizerSpec:
  """Workdirs without a record: data.tokenizer_path, else the one the trainer
  trained and cached under workdir/tokenizer/ (data/tokenizers.py's
  ``<type>-<size>-<cased|uncased>-<hash>/spm.model|vocab.txt``)."""
  data = (config or {}).get("data", None) or {}
  kind = data.get("tokenizer_type", "sentencepiece") or "sentencepiece"
  lower = bool(data.get("lower_case", True))
  path = data.get("tokenizer_path", "") or ""
  spec = tokenizer_files.TokenizerSpec
  if path:
    if not os.path.isabs(path) and not os.path.exists(path):
      path = os.path.join(workdir, path)
    if os.path.isfile(path):
      return spec(kind, path, lower)
    raise FileNotFoundError(f"data.tokenizer_path={path!r} does not exist.")
  pattern = "*.model" if kind == "sentencepiece" else "vocab.txt"
  root = os.path.join(workdir, "tokenizer")
  found = sorted(glob.glob(os.path.join(root, "**", pattern), recursive=True))
  if len(found) > 1:  # Prefer the one this config would have trained.
    name = (f"{kind}-{data.get('tokenizer_vocab_size', '')}-"
            f"{'uncased' if lower else 'cased'}-")
    matching = [f for f in found
                if os.path.basename(os.path.dirname(f)).startswith(name)]
    found = matching or found
    if len(found) > 1:
      found.sort(key=os.path.getmtime)
      logging.warning("Several tokenizers under %s; using the newest, %s.",
                      root, found[-1])
  if not found:
    raise FileNotFoundError(
        f"No tokenizer: data.tokenizer_path is empty and {root} holds no "
        f"{pattern}.")
  return spec(kind, found[-1], lower)
