"""What a new run's params start from, and so which tokenizer it uses.

``train.init_from`` (and an objective's teacher, e.g. DistilBERT's:
``Objective.teacher``) hand the run embeddings trained with
one tokenizer: token id i means what it meant there. So such a run's
tokenizer is theirs, never a new one trained on the corpus (whose ids would
mean other tokens: ``data.tokenizer_vocab_size`` does not apply).
:func:`resolve` runs at startup, before anything is written:

- each source is resolved (a path that is no checkpoint, another kind of
  model such as GPT-2, train.init_from of another architecture, or a
  teacher of another family or architecture, is one line naming the
  field);
- the run's ``data.tokenizer_type/tokenizer_path/lower_case`` become the
  source's tokenizer (its ``tokenizer/record.json``, or the vocab.txt /
  spiece.model / tokenizer.json of a Hugging Face or imported directory);
- a ``data.tokenizer_path`` naming another vocabulary, or two sources with
  different tokenizers, are refused with one line naming both. A source
  whose only tokenizer is a ``tokenizer.json`` runs it (``hf_json``: a
  byte-level BPE, SentencePiece or WordPiece, host-side); a given tokenizer
  of another kind is used instead when it tokenizes a probe text
  (:data:`PROBE`) as the ``tokenizers`` library does with that file, and
  refused otherwise.

A run that resumes from its own checkpoint uses the tokenizer it recorded
when it started, so the source may be gone by then.
"""

from __future__ import annotations

import os

import ml_collections
from absl import logging
from etils import epath

from bert_jax import compose
from bert_jax import families
from bert_jax import pretrained
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.data import shard_format
from bert_jax.data import tokenizers as tokenizers_lib
from bert_jax.hf import tokenizer_files


def sources(config) -> dict[str, str]:
  """{config field: path} of the params a new run of `config` starts from."""
  found = {}
  if config.train.init_from:
    found["train.init_from"] = config.train.init_from
  teacher = compose.objective(config).teacher
  if teacher is not None and teacher.path(config):
    found[teacher.field] = teacher.path(config)
  return found


def _contents(spec) -> bytes:
  return epath.Path(spec.path).read_bytes()


def _same(a, b) -> bool:
  """The same tokenizer: kind, case folding (WordPiece) and file bytes."""
  if a.kind != b.kind or (a.kind == "wordpiece" and
                          a.lower_case != b.lower_case):
    return False
  return a.path == b.path or _contents(a) == _contents(b)


def _describe(spec) -> str:
  case = ("" if spec.kind != "wordpiece" else
          ", uncased" if spec.lower_case else ", cased")
  return f"{spec.path} ({spec.kind}{case})"


def _resumes(workdir: str) -> bool:
  try:
    return bool(checkpoint_reading.committed_steps(workdir))
  except FileNotFoundError:
    return False


# The text a given tokenizer must tokenize as a source's tokenizer.json does
# (when that is all the source ships): several scripts, accents, digits,
# punctuation. It leaves out characters on which tf_text's and Hugging
# Face's normalizers are known to differ for one vocabulary (such as "ß"),
# so that a matching tokenizer is never refused.
PROBE = ("The quick brown fox jumps over the lazy dog; it's 3.14 km, not "
         "42! Café naïve résumé — Zürich. Москва и Киев. Αθήνα. 東京と大阪。"
         " 서울. مرحبا. हिन्दी. (e-mail: a@b.org) #1 50% [x]")


def _probe_difference(given, tokenizer_json: str) -> str | None:
  """None when `given` (a TokenizerSpec) gives `tokenizer_json`'s token ids
  on PROBE (bert_jax's tokenizer against the `tokenizers` library), else
  where they first differ."""
  ours = tokenizers_lib.load(given.path, given.kind,
                             given.lower_case).encode(PROBE)
  try:
    hf = tokenizer_files.load_hf_tokenizer(
        os.path.dirname(tokenizer_json)).tokenizer
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"{tokenizer_json} cannot be read by the tokenizers "
                     f"library ({e}).") from None
  hf.no_padding()  # Some pad every text to a fixed length (MiniLM's: 128).
  hf.no_truncation()
  theirs = hf.encode(PROBE, add_special_tokens=False).ids
  if list(ours) == list(theirs):
    return None
  k = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
           min(len(ours), len(theirs)))
  return (f"on a probe text it gives {len(ours)} token ids, the "
          f"tokenizer.json {len(theirs)}, the first difference at token {k} "
          f"({ours[k:k + 3]} vs {theirs[k:k + 3]})")


def _source_tokenizer(field: str, path: str, given, config):
  """The tokenizer the params at `path` were trained with; None when the
  config names one (`given`, a TokenizerSpec) that is used instead: when
  the source ships none, or only a tokenizer.json that `given` (a
  tokenizer of another kind, run in graph) tokenizes a probe text as
  (otherwise refused). train.init_from's architecture is checked here too
  (a teacher's family and architecture with the config,
  ``check_teacher``): before the run writes anything, not after its
  compile."""
  try:
    source = pretrained.resolve(path)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"{field}: {e}") from None
  if field == "train.init_from":
    pretrained.check_fits(source, config.model, field)
  try:
    spec = pretrained.tokenizer_spec(source)
  except FileNotFoundError as e:
    if given is not None:
      logging.warning("%s=%s ships no tokenizer file to compare with (%s); "
                      "using data.tokenizer_path as given.", field, path, e)
      return None
    raise FileNotFoundError(
        f"{field}: {e} Set data.tokenizer_path to the tokenizer its params "
        "were trained with.") from None
  if spec.kind == "hf_json" and given is not None and given.kind != "hf_json":
    # A tokenizer that runs in graph (a WordPiece tokenizer.json's
    # vocab.txt) is used instead when it gives the same ids.
    difference = _probe_difference(given, spec.path)
    if difference is not None:
      raise ValueError(
          f"data.tokenizer_path: {given.path} is not the tokenizer "
          f"{field}={path} was trained with ({spec.path}, a "
          f"{tokenizer_files.tokenizer_json_kind(spec.path)}): {difference}, "
          "so its embeddings would be read with other token ids.")
    logging.info("data.tokenizer_path=%s gives the token ids of %s on a "
                 "probe text.", given.path, spec.path)
    return None
  if field == "train.init_from":
    _check_source_tokenizer(path, spec, source)
  return spec


def _check_source_tokenizer(path: str, spec, source) -> None:
  """train.init_from's tokenizer has the special tokens masked-LM training
  needs and no more tokens than the source's embedding table has rows
  (ValueError naming both, before anything is written)."""
  tok = tokenizers_lib.load(spec.path, spec.kind, spec.lower_case)
  missing = tok.missing_special_tokens
  if missing:
    raise ValueError(
        f"train.init_from: {path}'s tokenizer {spec.path} lacks the special "
        f"token(s) {', '.join(missing)}: masked-LM training needs them.")
  rows = (int(source.config.model.vocab_size) if source.config is not None
          else None)
  if rows is not None and tok.vocab_size > rows:
    raise ValueError(
        f"train.init_from: {path}'s tokenizer {spec.path} has "
        f"{tok.vocab_size} tokens, but its embedding table has {rows} rows "
        f"(model.vocab_size): ids {rows} and up would have no embedding; the "
        "tokenizer is not the one these params were trained with.")


def check_teacher(config) -> None:
  """The objective's teacher, when it names a path, is a model of the
  teacher's family (DistilBERT's: a BERT) and of config.model's
  architecture, which the student's derives from: checked with the config
  (before anything is written; the trainer loads it only after the data
  and the compile). Errors name the field."""
  teacher = compose.objective(config).teacher
  path = teacher.path(config) if teacher is not None else ""
  if not path:
    return
  try:
    source = pretrained.resolve(path)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"{teacher.field}: {e}") from None
  want = families.get(teacher.family)
  have = (compose.family(source.config).name if source.config is not None
          else "bert")
  if have != want.name:
    classes = " / ".join(c for _, c in want.pretraining_tables[0].architectures)
    raise ValueError(
        f"{teacher.field}: {path} holds the model of a {source.objective!r} "
        f"run ({source.kind}), not a {want.title}: the teacher must be a "
        f"{want.title} (a {want.title} pretraining workdir, or a {classes} "
        "directory).")
  pretrained.check_fits(source, config.model, teacher.field, note=(
      " (the teacher's architecture, which the student's derives from)"))


def resolve(config, workdir: str) -> ml_collections.ConfigDict:
  """`config` with the tokenizer of the params it starts from (a copy;
  `config` itself when it starts from none), else of the pre-tokenized
  shards it reads. ValueError or FileNotFoundError, one sentence naming the
  field, when a source is no checkpoint or the tokenizers disagree (the
  shards' too)."""
  return _with_shards(_from_params(config, workdir))


# Model fields that are how a run computes, not what its params are: never
# taken from init_from; and fields the user may set to another value than
# init_from's (dropout, the size of a task head).
_RUNTIME_FIELDS = ("dtype", "attention_impl", "splash_interpret", "fused_qkv",
                   "remat_policy")
_FREE_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob",
                "classifier_dropout_prob", "num_labels")


def adopt_architecture(config, overrides) -> ml_collections.ConfigDict:
  """`config` with train.init_from's model config (a copy): the source
  decides the architecture and vocabulary, not the config file's sizes.
  `overrides`: the config fields the user set ("model.hidden_size", from
  the command line); one that contradicts the source is refused naming
  both values (a larger model.vocab_size only pads the table), as is a
  source of another family than the run's. Runs that start from nothing
  are returned as they are."""
  path = config.train.init_from
  if not path:
    return config
  try:
    source = pretrained.resolve(path)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"train.init_from: {e}") from None
  if source.config is None:
    return config
  have, want = compose.family(source.config), compose.family(config)
  if have.name != want.name:
    raise ValueError(
        f"train.init_from: {path} holds a {have.title} model "
        f"({source.objective!r}), but the config trains "
        f"objective.name={config.objective.name!r} ({want.title}); use a "
        f"{have.title} config.")
  out = ml_collections.ConfigDict(config.to_dict())
  taken = []
  for field, theirs in source.config.model.items():
    mine = out.model.get(field)
    if field in _RUNTIME_FIELDS or mine == theirs:
      continue
    if f"model.{field}" in overrides:
      if field in _FREE_FIELDS or (field == "vocab_size" and
                                   int(mine) > int(theirs)):
        continue
      raise ValueError(
          f"train.init_from: {path} has model.{field}={theirs}, but "
          f"--config.model.{field}={mine} was given: the source's config "
          "decides the architecture; drop the override.")
    out.model[field] = theirs
    taken.append(f"{field}={theirs}")
  if taken:
    logging.info("Model from train.init_from=%s: %s.", path, ", ".join(taken))
  return out


def _shard_manifests(data) -> list:
  """(field, manifest) of every shards source of `data`."""
  from bert_jax.data import sources as data_sources  # TensorFlow's gfile.
  return [(f"data.{field}", shard_format.read_manifest(s.spec,
                                                       f"data.{field}"))
          for field in ("sources", "eval_sources")
          for s in data_sources.parse_sources(data.get(field, ""),
                                              f"data.{field}")
          if s.kind == data_sources.SHARDS]


def _with_shards(config) -> ml_collections.ConfigDict:
  """Shards are token ids of one tokenizer: a run that names none (and
  starts from no params) takes theirs; any other is refused, as are shards
  cut into other blocks than the config's (``shard_format.check_run``)."""
  manifests = _shard_manifests(config.data)
  if not manifests:
    return config
  if not config.data.tokenizer_path:
    field, m = manifests[0]
    config = _with(config, tokenizer_files.TokenizerSpec(
        m.tokenizer["kind"], m.tokenizer_path,
        bool(m.tokenizer["lower_case"])),
                   f"the one {field}: shards:{m.directory} were made with")
  data = config.data
  digest = shard_format.tokenizer_hash(data.tokenizer_path,
                                       data.tokenizer_type,
                                       bool(data.lower_case))
  for field, m in manifests:
    shard_format.check_run(m, data, digest, data.tokenizer_path, field)
  return config


def _from_params(config, workdir: str) -> ml_collections.ConfigDict:
  """`config` with the tokenizer of the params it starts from."""
  found = sources(config)
  if not found:
    return config
  data = config.data
  given = None
  if data.tokenizer_path:
    given = tokenizer_files.TokenizerSpec(
        data.tokenizer_type, data.tokenizer_path, bool(data.lower_case))
  if _resumes(workdir):
    # The params came from the source when this run started; its record
    # names the tokenizer it has used since.
    spec = pretrained.recorded_tokenizer(workdir)
    if spec is None or given is not None:
      return config
    return _with(config, spec, f"the one this run recorded in {workdir}")
  chosen, chosen_field = None, ""
  for field, path in found.items():
    spec = _source_tokenizer(field, path, given, config)
    if spec is None:
      continue
    if chosen is not None and not _same(chosen, spec):
      raise ValueError(
          f"{chosen_field}: {found[chosen_field]} and {field}={path} were "
          f"trained with different tokenizers ({_describe(chosen)} vs "
          f"{_describe(spec)}): their token ids mean different tokens, so "
          "one run cannot start from both.")
    chosen, chosen_field = chosen or spec, chosen_field or field
  if given is not None:
    if chosen is not None and not _same(given, chosen):
      raise ValueError(
          f"data.tokenizer_path: {data.tokenizer_path} is not the tokenizer "
          f"{chosen_field}={found[chosen_field]} was trained with "
          f"({_describe(chosen)}): its embeddings would be read with other "
          "token ids. Leave data.tokenizer_path empty to use that one.")
    return config
  return _with(config, chosen, f"the one {chosen_field}="
               f"{found[chosen_field]} was trained with")


def _with(config, spec, which: str):
  out = ml_collections.ConfigDict(config.to_dict())
  out.data.update(tokenizer_type=spec.kind, tokenizer_path=spec.path,
                  lower_case=bool(spec.lower_case))
  logging.info("Tokenizer: %s, %s (a new one would give the embeddings "
               "other token ids; data.tokenizer_vocab_size does not apply).",
               _describe(spec), which)
  return out
