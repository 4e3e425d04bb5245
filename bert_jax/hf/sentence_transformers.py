"""sentence-transformers directories: the modules read and written.

A sentence-transformers model is a Hugging Face encoder directory plus a
``modules.json`` listing what runs after the encoder: ``Pooling`` (its
``1_Pooling/config.json``: the mean over real tokens or the [CLS] vector)
and optionally ``Normalize`` (L2, no config). ``sentence_bert_config.json``
(or, as sentence-transformers 6 writes it, ``tokenizer_config.json``'s
``model_max_length``) holds the length texts are cut to.

:func:`read` gives a directory's :class:`Modules` (None for a plain
Hugging Face directory); anything this project does not compute (max or
weighted-mean pooling, a Dense layer after pooling, the encoder in a
sub-directory) is refused with one line naming the file and the module.
:func:`write` writes the files beside an exported encoder, in the layout
every sentence-transformers release since 2.0 loads.
"""

from __future__ import annotations

import dataclasses
import json
import os

from bert_jax.models import heads

MODULES_FILE = "modules.json"
POOLING_DIR = "1_Pooling"
NORMALIZE_DIR = "2_Normalize"
ST_CONFIG = "sentence_bert_config.json"
ST_MODEL_CONFIG = "config_sentence_transformers.json"
POOLINGS = heads.POOLINGS
_TRANSFORMER, _POOLING, _NORMALIZE = "Transformer", "Pooling", "Normalize"
# Legacy (every release) pooling keys -> our pooling.
_LEGACY_POOLING = {"pooling_mode_mean_tokens": "mean",
                   "pooling_mode_cls_token": "cls",
                   "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean",
                   "pooling_mode_lasttoken": "lasttoken"}


@dataclasses.dataclass(frozen=True)
class Modules:
  """What a sentence-transformers directory computes after its encoder."""
  pooling: str  # "mean" (over real tokens) or "cls"
  normalize: bool  # L2-normalised vectors
  max_seq_length: int | None  # texts cut to this many tokens; None: unset


def _load(path: str):
  with open(path) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path} is not valid JSON ({e}).") from None


def _module_kind(entry: dict, path: str) -> str:
  """"Transformer", "Pooling", "Normalize" or ValueError naming the type."""
  name = str(entry.get("type", "")).rsplit(".", 1)[-1]
  if name not in (_TRANSFORMER, _POOLING, _NORMALIZE):
    raise ValueError(
        f"{path}: module {entry.get('type')!r} ({entry.get('path')!r}) is "
        "not one bert_jax computes (it reads a Transformer, then Pooling "
        "and optionally Normalize).")
  return name


def _pooling(directory: str) -> str:
  path = os.path.join(directory, "config.json")
  if not os.path.isfile(path):
    raise ValueError(f"{directory} has no config.json: the Pooling module's "
                     "settings are missing.")
  cfg = _load(path)
  modes = cfg.get("pooling_mode")
  if modes is None:
    modes = [m for k, m in _LEGACY_POOLING.items() if cfg.get(k)]
  modes = [modes] if isinstance(modes, str) else list(modes)
  if len(modes) != 1 or modes[0] not in POOLINGS:
    raise ValueError(f"{path}: pooling {modes} is not one bert_jax computes "
                     f"(one of {', '.join(POOLINGS)}).")
  if cfg.get("include_prompt") is False:
    raise ValueError(f"{path}: include_prompt=false (prompt tokens left out "
                     "of the pooling) is not one bert_jax computes.")
  return modes[0]


def _max_seq_length(directory: str) -> int | None:
  path = os.path.join(directory, ST_CONFIG)
  if os.path.isfile(path) and _load(path).get("max_seq_length") is not None:
    return int(_load(path)["max_seq_length"])
  tok = os.path.join(directory, "tokenizer_config.json")
  if os.path.isfile(tok):
    value = _load(tok).get("model_max_length")
    if isinstance(value, int) and value < 1_000_000:  # HF's "unset" is huge.
      return value
  return None


def read(directory: str) -> Modules | None:
  """The directory's modules, or None when it has no modules.json (a plain
  Hugging Face directory). ValueError naming the file for a module or a
  pooling bert_jax does not compute."""
  path = os.path.join(directory, MODULES_FILE)
  if not os.path.isdir(directory) or not os.path.isfile(path):
    return None
  entries = sorted(_load(path), key=lambda e: int(e.get("idx", 0)))
  kinds = [_module_kind(e, path) for e in entries]
  if not kinds or kinds[0] != _TRANSFORMER or kinds.count(_POOLING) != 1 or (
      kinds[1:] not in ([_POOLING], [_POOLING, _NORMALIZE])):
    raise ValueError(f"{path}: modules {kinds} are not a Transformer, then "
                     "Pooling and optionally Normalize.")
  if entries[0].get("path", "") not in ("", "."):
    raise ValueError(f"{path}: the Transformer lives in "
                     f"{entries[0]['path']!r}; bert_jax reads a directory "
                     "whose encoder files are at its top (path \"\").")
  pooling = _pooling(os.path.join(directory, entries[1].get("path", "")))
  return Modules(pooling=pooling, normalize=_NORMALIZE in kinds,
                 max_seq_length=_max_seq_length(directory))


def write(directory: str, *, dimension: int, modules: Modules,
          versions: dict | None = None) -> list[str]:
  """modules.json, 1_Pooling/config.json, sentence_bert_config.json and
  config_sentence_transformers.json in `directory` (beside the encoder's
  config.json, weights and tokenizer files); returns the files written."""
  if modules.pooling not in POOLINGS:
    raise ValueError(f"pooling {modules.pooling!r} must be one of "
                     f"{POOLINGS}.")
  entries = [dict(idx=0, name="0", path="",
                  type="sentence_transformers.models.Transformer"),
             dict(idx=1, name="1", path=POOLING_DIR,
                  type="sentence_transformers.models.Pooling")]
  if modules.normalize:
    entries.append(dict(idx=2, name="2", path=NORMALIZE_DIR,
                        type="sentence_transformers.models.Normalize"))
  pooling = {"word_embedding_dimension": int(dimension)}
  pooling.update({k: modules.pooling == mode
                  for k, mode in _LEGACY_POOLING.items()})
  files = {MODULES_FILE: entries,
           os.path.join(POOLING_DIR, "config.json"): pooling,
           ST_CONFIG: dict(max_seq_length=modules.max_seq_length,
                           do_lower_case=False),
           ST_MODEL_CONFIG: {"__version__": dict(versions or {}),
                             "prompts": {}, "default_prompt_name": None,
                             "similarity_fn_name": "cosine"}}
  for name, content in files.items():
    path = os.path.join(directory, name)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
      json.dump(content, f, indent=2)
  return list(files)
