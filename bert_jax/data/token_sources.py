"""Where token-tagging (NER) sentences come from: CoNLL files, JSONL, TFDS.

Every reader gives :class:`TaggedSentences`: per sentence its words and
their tag strings, and where it came from (``file:line`` or the TFDS index),
so a message or a predictions file can point back at the source.

* CoNLL column files: one word per line, columns split on whitespace, the
  word in ``word_column`` and the tag in ``tag_column`` (default -1: the
  last, as in CoNLL-2003's ``word POS chunk NER``); a blank line ends a
  sentence; ``-DOCSTART-`` lines are document markers, skipped.
* JSONL: one object per line, ``{"tokens": [...], "tags": [...]}`` (field
  names configurable).
* TFDS ``conll2003`` from a prepared ``tfds_data_dir`` (tags are the
  dataset's ``ner`` ClassLabel names; splits train / dev / test).

Tags are ``O`` or ``<B|I|E|S>-<type>`` (IOB1, IOB2 and BIOES all fit;
``downstream/entity_metrics`` reads them with conlleval's rules). Anything
else, a line without the tag column, a sentence whose tokens and tags differ
in number, or a split without sentences is bad input: one ValueError naming
the file and line, before anything is written.

The tag set is taken from the training data (``O`` first, then sorted; the
ClassLabel order for TFDS) and saved as the run's ``label_map.json``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from typing import Optional, Sequence

from absl import logging

from bert_jax.data import task_sources

TAG = re.compile(r"^(O|[BIES]-.+)$")
DOCSTART = "-DOCSTART-"
CONLL2003 = "conll2003"
# TFDS token tasks: name -> (validation split, tokens feature, tags feature).
TFDS_TASKS = {CONLL2003: ("dev", "tokens", "ner")}


@dataclasses.dataclass
class TaggedSentences:
  """One split: parallel lists of words, tags and source positions."""
  words: list[list[str]]
  tags: list[list[str]]
  where: list[str]  # "path:line" of the first word, or "tfds:<split>:<i>"

  def __len__(self):
    return len(self.words)

  def num_words(self) -> int:
    return sum(len(w) for w in self.words)


def _read_text(path: str) -> str:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"Task file {path!r} does not exist.")
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read().decode("utf-8-sig", errors="replace")


def _check_tags(tags: Sequence[str], where: str) -> None:
  for t in tags:
    if not TAG.match(t):
      raise ValueError(f"{where}: tag {t!r} is not O or B-/I-/E-/S-<type> "
                       "(IOB1, IOB2 or BIOES).")


def read_conll(path: str, tag_column: int = -1,
               word_column: int = 0) -> TaggedSentences:
  """A CoNLL column file -> sentences (see the module docstring)."""
  words, tags, where = [], [], []
  cur_w, cur_t, start = [], [], ""
  need = max(word_column if word_column >= 0 else -word_column - 1,
             tag_column if tag_column >= 0 else -tag_column - 1) + 1

  def flush():
    if cur_w:
      words.append(list(cur_w))
      tags.append(list(cur_t))
      where.append(start)
    cur_w.clear()
    cur_t.clear()

  for n, line in enumerate(_read_text(path).split("\n"), start=1):
    cols = line.split()
    if not cols:
      flush()
      continue
    if cols[0] == DOCSTART:
      flush()
      continue
    if len(cols) < max(need, 2):
      raise ValueError(
          f"{path}:{n}: {len(cols)} column(s) {cols!r}, but the word is "
          f"column {word_column} and the tag column {tag_column} "
          "(task.tag_column) of at least 2: is the tag column missing?")
    if not cur_w:
      start = f"{path}:{n}"
    _check_tags([cols[tag_column]], f"{path}:{n}")
    cur_w.append(cols[word_column])
    cur_t.append(cols[tag_column])
  flush()
  return TaggedSentences(words, tags, where)


def read_jsonl(path: str, tokens_field: str = "tokens",
               tags_field: str = "tags") -> TaggedSentences:
  """One ``{"tokens": [...], "tags": [...]}`` object per line."""
  words, tags, where = [], [], []
  for n, line in enumerate(_read_text(path).split("\n"), start=1):
    if not line.strip():
      continue
    at = f"{path}:{n}"
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{at}: not a JSON object ({e.msg}).") from e
    if not isinstance(obj, dict) or not isinstance(obj.get(tokens_field),
                                                   list) or not isinstance(
                                                       obj.get(tags_field),
                                                       list):
      raise ValueError(f"{at}: needs lists {tokens_field!r} and "
                       f"{tags_field!r} (task.tokens_field, task.tags_field).")
    w = [str(x) for x in obj[tokens_field]]
    t = [x if isinstance(x, str) else repr(x) for x in obj[tags_field]]
    if len(w) != len(t):
      raise ValueError(f"{at}: {len(w)} tokens but {len(t)} tags.")
    if not w:
      continue
    _check_tags(t, at)
    words.append(w)
    tags.append(t)
    where.append(at)
  return TaggedSentences(words, tags, where)


def read_file(path: str, *, tag_column: int = -1, tokens_field: str = "tokens",
              tags_field: str = "tags") -> TaggedSentences:
  """JSONL by extension (.jsonl / .json / .ndjson), else CoNLL columns."""
  if path.lower().endswith((".jsonl", ".json", ".ndjson")):
    return read_jsonl(path, tokens_field, tags_field)
  return read_conll(path, tag_column)


def read_tfds(name: str, split: str, data_dir: str
              ) -> tuple[TaggedSentences, list[str]]:
  """A prepared TFDS token task -> (sentences, its ClassLabel tag names)."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  _, tokens_key, tags_key = TFDS_TASKS[name]
  with task_sources.prepared_tfds(name, split, data_dir):
    builder = tfds.builder(name, data_dir=data_dir or None)
    names = list(builder.info.features[tags_key].feature.names)
    ds = builder.as_dataset(split=split, shuffle_files=False,
                            read_config=tfds.ReadConfig(try_autocache=False))
  words, tags, where = [], [], []
  for i, ex in enumerate(tfds.as_numpy(ds)):
    w = [x.decode("utf-8", "replace") for x in ex[tokens_key]]
    if not w:
      continue
    words.append(w)
    tags.append([names[int(t)] for t in ex[tags_key]])
    where.append(f"tfds:{name}:{split}:{i}")
  return TaggedSentences(words, tags, where), names


def tag_order(sentences: TaggedSentences) -> list[str]:
  """The tag set of the training data: ``O`` first, then sorted."""
  seen = {t for ts in sentences.tags for t in ts}
  return sorted(seen, key=lambda t: (t != "O", t))


@dataclasses.dataclass(frozen=True)
class TokenTask:
  """A token task read: its name, tag names (id order), eval split names."""
  name: str
  label_names: tuple[str, ...]
  eval_splits: tuple[str, ...] = ("validation",)
  train_split: str = "train"

  @property
  def num_labels(self) -> int:
    return len(self.label_names)


def load_task(name: str, *, tfds_data_dir: str = "", train_path: str = "",
              validation_path: str = "", tag_column: int = -1,
              tokens_field: str = "tokens", tags_field: str = "tags",
              label_dir: str = "", write_label_map: bool = True
              ) -> tuple[TokenTask, dict[str, TaggedSentences]]:
  """``conll2003`` from TFDS, or the user's files -> (task, {split: data}).

  The tag names come from ``label_dir/label_map.json`` when it exists (a
  resumed run), else from the training split, and are saved there
  (unless not `write_label_map`: a caller with checks of its own writes
  them after those, :func:`save_label_map`).
  """
  rows: dict[str, TaggedSentences] = {}
  saved = task_sources.load_label_map(label_dir) if label_dir else None
  if name in TFDS_TASKS:
    dev = TFDS_TASKS[name][0]
    rows["train"], names = read_tfds(name, "train", tfds_data_dir)
    rows[dev], _ = read_tfds(name, dev, tfds_data_dir)
    evals = (dev,)
    where = {s: f"{name} in tfds_data_dir={tfds_data_dir!r}" for s in rows}
  else:
    if not (train_path and validation_path):
      raise ValueError(f"task.name={name!r} is not a TFDS token task "
                       f"({', '.join(TFDS_TASKS)}), so it reads your files: "
                       "set task.train_file and task.validation_file (CoNLL "
                       "columns or JSONL).")
    kw = dict(tag_column=tag_column, tokens_field=tokens_field,
              tags_field=tags_field)
    rows["train"] = read_file(train_path, **kw)
    rows["validation"] = read_file(validation_path, **kw)
    names = tag_order(rows["train"])
    evals = ("validation",)
    where = dict(train=f"task.train_file={train_path}",
                 validation=f"task.validation_file={validation_path}")
  for split, data in rows.items():
    if not len(data):
      raise ValueError(f"The {split} split of task {name!r} ({where[split]}) "
                       "holds no sentence (empty file, or only -DOCSTART- "
                       "and blank lines).")
  names = _merge_saved(saved, names, rows["train"], label_dir)
  for split in evals:
    warn_unknown_tags(split, rows[split], names, where[split])
  if label_dir and write_label_map:
    save_label_map(label_dir, names)
  return TokenTask(name, tuple(names), evals), rows


def warn_unknown_tags(split: str, data: TaggedSentences, names,
                      where: str) -> None:
  """One warning (count and the tags) when an eval split holds tags the
  training data lacks: the model never predicts them, so their entities
  score as missed (as sentence tasks warn of unknown labels)."""
  known = set(names)
  counts = collections.Counter(t for ts in data.tags for t in ts
                               if t not in known)
  if not counts:
    return
  sentences = sum(any(t not in known for t in ts) for ts in data.tags)
  tags = sorted(counts)
  logging.warning(
      "The %s split (%s): %d words in %d sentences carry tags the training "
      "data lacks (%s): the model never predicts them, so their entities "
      "score as missed.", split, where, sum(counts.values()), sentences,
      ", ".join(tags[:10]) + (", ..." if len(tags) > 10 else ""))


def save_label_map(directory: str, names) -> str:
  """``directory/label_map.json`` of the tag set (the sentence tasks'
  format, ``task_sources.save_label_map``)."""
  return task_sources.save_label_map(directory, names)


def _merge_saved(saved: Optional[list[str]], names: list[str],
                 train: TaggedSentences, label_dir: str) -> list[str]:
  """A resumed run keeps its saved tag ids; its train data must fit them."""
  if saved is None:
    return names
  unknown = sorted({t for ts in train.tags for t in ts} - set(saved))
  if unknown:
    raise ValueError(f"The training data has tags {unknown} that "
                     f"{label_dir}/{task_sources.LABEL_MAP_FILE} lacks: use "
                     "a fresh workdir for another tag set.")
  return saved
