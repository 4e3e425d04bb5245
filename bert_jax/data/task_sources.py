"""Where fine-tuning rows come from: GLUE (prepared TFDS) or the user's files.

Both give :class:`Rows`: parallel arrays of first text, optional second text,
label (class id or float) and the row's index in its split. Everything is read
into host memory once (GLUE's largest training split, MNLI, is 393k pairs), so
the tf.data pipeline (``task_data``) can shuffle by index without buffering
strings in its checkpointed state.

User files (``.csv``/``.tsv`` with a header row, or ``.jsonl`` one object per
line) name their text, optional text-pair and label fields. String labels map
to ids by ``label_order``: ``"sorted"`` (numeric order when every label is an
integer, else string order) or ``"first_seen"``, always taken from the TRAIN
file, and saved as ``label_map.json`` so an evaluated or resumed run uses the
same ids. Bad rows are counted and skipped, never crash and never shift labels.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import io
import json
import os
from typing import IO, Optional, Sequence

import numpy as np
from absl import logging

LABEL_MAP_FILE = "label_map.json"
ACCURACY, F1, MCC, PEARSON, SPEARMAN = (
    "accuracy", "f1", "matthews_corrcoef", "pearson", "spearman")


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """What a task is: its text fields, labels, metrics and eval splits."""
  name: str                      # "glue/sst2", or the user's task name
  text_keys: tuple[str, ...]     # 1 (single sentence) or 2 (pair) fields
  label_key: str = "label"
  label_names: tuple[str, ...] = ()  # id order; () for regression
  metrics: tuple[str, ...] = (ACCURACY,)
  eval_splits: tuple[str, ...] = ("validation",)
  train_split: str = "train"

  @property
  def regression(self) -> bool:
    return not self.label_names

  @property
  def num_labels(self) -> int:
    """Width of the head: classes, or 1 for regression."""
    return len(self.label_names) or 1

  @property
  def is_pair(self) -> bool:
    return len(self.text_keys) == 2


def _glue(name, keys, labels, metrics=(ACCURACY,), evals=("validation",)):
  return TaskSpec(f"glue/{name}", tuple(keys), "label", tuple(labels),
                  tuple(metrics), tuple(evals))


# Label names in TFDS ClassLabel order (checked against tfds in the tests).
GLUE = {s.name: s for s in (
    _glue("cola", ["sentence"], ["unacceptable", "acceptable"], [MCC]),
    _glue("sst2", ["sentence"], ["negative", "positive"]),
    _glue("mrpc", ["sentence1", "sentence2"], ["not_equivalent", "equivalent"],
          [F1, ACCURACY]),
    _glue("qqp", ["question1", "question2"], ["not_duplicate", "duplicate"],
          [F1, ACCURACY]),
    _glue("stsb", ["sentence1", "sentence2"], [], [PEARSON, SPEARMAN]),
    _glue("mnli", ["premise", "hypothesis"],
          ["entailment", "neutral", "contradiction"], [ACCURACY],
          ["validation_matched", "validation_mismatched"]),
    _glue("qnli", ["question", "sentence"], ["entailment", "not_entailment"]),
    _glue("rte", ["sentence1", "sentence2"], ["entailment", "not_entailment"]),
    _glue("wnli", ["sentence1", "sentence2"], ["not_entailment", "entailment"]),
)}


def glue_task(name: str) -> TaskSpec:
  """The registry entry for ``glue/<task>`` (the ``glue/`` prefix optional)."""
  key = name if name.startswith("glue/") else f"glue/{name}"
  if key not in GLUE:
    raise ValueError(f"task={name!r} is not a GLUE task; choose one of "
                     f"{sorted(GLUE)} or give your own files.")
  return GLUE[key]


@dataclasses.dataclass
class Rows:
  """One split in memory; ``index`` is each row's position in its source."""
  text_a: np.ndarray            # object array of str
  text_b: Optional[np.ndarray]  # same, or None for single-sentence tasks
  labels: np.ndarray            # int32 class ids or float32 targets
  index: np.ndarray             # int64
  bad: dict = dataclasses.field(default_factory=dict)  # counter name -> n

  def __len__(self):
    return len(self.labels)


# -----------------------------------------------------------------------------
# GLUE from a prepared TFDS directory.
# -----------------------------------------------------------------------------


def prepare_hint(name: str, data_dir: str) -> str:
  return (f"prepare it once on a connected machine with `tfds build {name} "
          f"--data_dir {data_dir}` (or `python -c \"import tensorflow_datasets "
          f"as tfds; tfds.load('{name}', data_dir='{data_dir}')\"`) and copy "
          "the directory here or to a bucket")


@contextlib.contextmanager
def prepared_tfds(name: str, split: str, data_dir: str):
  """Opening a TFDS split inside this block: a split that is not prepared
  in `data_dir` (TFDS raises one of four errors, by how it is missing)
  becomes one FileNotFoundError that names it and says how to prepare it
  (nothing is downloaded at run time). Every task kind reads TFDS here."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    yield
  except (AssertionError, FileNotFoundError, ValueError,
          tfds.core.registered.DatasetNotFoundError) as e:
    raise FileNotFoundError(
        f"TFDS dataset {name!r} split {split!r} is not prepared in "
        f"tfds_data_dir={data_dir!r}; {prepare_hint(name, data_dir)}. "
        f"({type(e).__name__}: {str(e)[:200]})") from e


def read_glue(spec: TaskSpec, split: str, data_dir: str) -> Rows:
  """Reads a whole GLUE split from ``data_dir`` (never downloads).

  Every process reads the whole split: ``task_data`` slices global batches
  per process (see its docstring for why).
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with prepared_tfds(spec.name, split, data_dir):
    ds = tfds.load(spec.name, split=split, data_dir=data_dir or None,
                   download=False, shuffle_files=False,
                   read_config=tfds.ReadConfig(try_autocache=False))
  cols = {k: [] for k in (*spec.text_keys, spec.label_key)}
  for batch in tfds.as_numpy(ds.batch(4096)):
    for k in cols:
      cols[k].append(batch[k])
  cols = {k: (np.concatenate(v) if v else np.zeros([0])) for k, v in
          cols.items()}
  dec = lambda a: np.array([x.decode("utf-8", "replace") for x in a], object)
  labels = cols[spec.label_key]
  labels = (labels.astype(np.float32) if spec.regression
            else labels.astype(np.int32))
  b = dec(cols[spec.text_keys[1]]) if spec.is_pair else None
  return Rows(dec(cols[spec.text_keys[0]]), b, labels,
              np.arange(len(labels), dtype=np.int64))


# -----------------------------------------------------------------------------
# The user's own files.
# -----------------------------------------------------------------------------

BAD_COUNTERS = ("bad_lines", "wrong_column_count", "missing_text",
                "missing_label", "unknown_label")


def open_file(path: str, hint: str = "") -> IO[bytes]:
  """`path` opened to read bytes: a local file, or a tf.io.gfile path
  (gs://), so TensorFlow is imported only for a remote one.
  FileNotFoundError naming the path (and `hint`, what the file should be)
  when there is none."""
  if "://" in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (gs://)
    exists, opener = tf.io.gfile.exists, tf.io.gfile.GFile
  else:
    exists, opener = os.path.isfile, open
  if not exists(path):
    raise FileNotFoundError(f"{path} does not exist"
                            + (f" ({hint})." if hint else "."))
  return opener(path, "rb")


def json_lines(path: str, lines):
  """(line number from 1, parsed value) of each non-blank line of the
  JSONL file `path`; ValueError naming the file and line for one that is
  not JSON."""
  for n, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}:{n}: not a JSON object ({e}).") from None
    yield n, obj


def file_format(path: str, fmt: str = "") -> str:
  fmt = (fmt or os.path.splitext(path)[1].lstrip(".")).lower()
  fmt = {"json": "jsonl", "ndjson": "jsonl"}.get(fmt, fmt)
  if fmt not in ("csv", "tsv", "jsonl"):
    raise ValueError(f"Cannot tell the format of {path!r}: name it .csv, .tsv "
                     "or .jsonl, or set the task's file_format.")
  return fmt


def _raw_records(path: str, fmt: str, fields: Sequence[str], bad):
  """Yields (row number, {field: str or None}); counts unreadable rows."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"Task file {path!r} does not exist.")
  with tf.io.gfile.GFile(path, "rb") as f:
    text = f.read().decode("utf-8-sig", errors="replace")  # Excel: BOM
  if fmt == "jsonl":
    for n, line in enumerate(text.split("\n")):  # not splitlines: U+2028
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError:
        obj = None
      if not isinstance(obj, dict):
        bad["bad_lines"] += 1
        continue
      yield n, {k: (None if obj.get(k) is None else str(obj[k]))
                for k in fields}
    return
  reader = csv.reader(
      io.StringIO(text, newline=""), delimiter="\t" if fmt == "tsv" else ",",
      quoting=csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL)
  try:
    header = next(reader)
  except StopIteration:
    return
  missing = [k for k in fields if k not in header]
  if missing:
    raise ValueError(f"Task file {path!r} has no column(s) {missing} in its "
                     f"header {header}; set the task's field names.")
  pos = {k: header.index(k) for k in fields}
  n = -1
  while True:
    n += 1
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error:
      bad["bad_lines"] += 1
      continue
    if not row or (len(row) == 1 and not row[0].strip()):
      continue
    if len(row) != len(header):
      bad["wrong_column_count"] += 1
      continue
    yield n, {k: row[i] for k, i in pos.items()}


def sort_labels(names: Sequence[str]) -> list[str]:
  """Numeric order if every label is an integer, else string order."""
  names = sorted(set(names))
  try:
    return sorted(names, key=int)
  except ValueError:
    return names


def read_file(path: str, text_field: str, label_field: str,
              text_pair_field: str = "", *, label_names: Sequence[str] = (),
              regression: bool = False, label_order: str = "sorted",
              fmt: str = "", labels_from: str = "") -> tuple[Rows, list[str]]:
  """Reads one user file; returns (rows, label names in id order).

  ``label_names`` fixes the mapping (validation files, resumed runs): a label
  outside it is counted as ``unknown_label`` and its row skipped, or, with
  ``labels_from`` (the label map the names were read from: a workdir's
  earlier task), is a ValueError naming that map. Without it (the train
  file) the mapping is built from this file by ``label_order``.
  """
  if label_order not in ("sorted", "first_seen"):
    raise ValueError(f"label_order={label_order!r} must be 'sorted' or "
                     "'first_seen'.")
  fmt = file_format(path, fmt)
  fields = [text_field] + ([text_pair_field] if text_pair_field else []) + [
      label_field]
  bad = collections.Counter({k: 0 for k in BAD_COUNTERS})
  recs = []
  for n, rec in _raw_records(path, fmt, fields, bad):
    texts = [rec[text_field]] + ([rec[text_pair_field]] if text_pair_field
                                 else [])
    if any(t is None or not t.strip() for t in texts):
      bad["missing_text"] += 1
      continue
    label = rec[label_field]
    if label is None or not label.strip():
      bad["missing_label"] += 1
      continue
    label = label.strip()
    if regression:
      try:
        label = float(label)
      except ValueError:
        bad["missing_label"] += 1
        continue
      if not np.isfinite(label):
        bad["missing_label"] += 1
        continue
    recs.append((n, texts, label))
  names = list(label_names)
  if not regression:
    if not names:
      seen = list(dict.fromkeys(r[2] for r in recs))
      names = seen if label_order == "first_seen" else sort_labels(seen)
    ids = {name: i for i, name in enumerate(names)}
    other = sort_labels({r[2] for r in recs if r[2] not in ids})
    if labels_from and other:
      raise ValueError(
          f"{labels_from} maps the labels {names} of the task this workdir "
          f"was fine-tuned on, but {path} has other labels too "
          f"({', '.join(other[:5])}{', ...' if len(other) > 5 else ''}): a "
          "task with other labels needs a new --workdir.")
    kept = [r for r in recs if r[2] in ids]
    bad["unknown_label"] += len(recs) - len(kept)
    recs = [(n, t, ids[lab]) for n, t, lab in kept]
  bad = dict(bad)
  if any(bad.values()):
    lacking = ""
    if not regression and bad["unknown_label"]:
      lacking = (f" (labels the training data lacks: {', '.join(other[:5])}"
                 f"{', ...' if len(other) > 5 else ''})")
    logging.warning("Task file %s: kept %d rows, skipped bad rows: %s%s",
                    path, len(recs), ", ".join(
                        f"{k}={v}" for k, v in bad.items() if v), lacking)
  rows = Rows(
      np.array([r[1][0] for r in recs], object),
      np.array([r[1][1] for r in recs], object) if text_pair_field else None,
      np.array([r[2] for r in recs],
               np.float32 if regression else np.int32),
      np.array([r[0] for r in recs], np.int64), bad)
  return rows, ([] if regression else names)


def save_label_map(directory: str, names: Sequence[str]) -> str:
  """Writes ``directory/label_map.json`` ({"label2id": {name: id}})."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.io.gfile.makedirs(directory)
  path = os.path.join(directory, LABEL_MAP_FILE)
  with tf.io.gfile.GFile(path, "w") as f:
    json.dump({"label2id": {n: i for i, n in enumerate(names)}}, f, indent=1)
  return path


def load_label_map(directory: str) -> Optional[list[str]]:
  """Label names in id order from ``directory/label_map.json``, or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, LABEL_MAP_FILE)
  if not tf.io.gfile.exists(path):
    return None
  with tf.io.gfile.GFile(path) as f:
    label2id = json.load(f)["label2id"]
  names = sorted(label2id, key=label2id.get)
  if [label2id[n] for n in names] != list(range(len(names))):
    raise ValueError(f"{path} does not map labels to ids 0..{len(names) - 1}.")
  return names


def _skipped(rows: Rows) -> str:
  """' (skipped: missing_text=3, ...)' for a split's bad-row counters."""
  bad = ", ".join(f"{k}={v}" for k, v in rows.bad.items() if v)
  return f" (skipped: {bad})" if bad else " (it has no data rows)"


def check_not_empty(split: str, rows: Rows, where: str) -> None:
  """ValueError naming the split and its source when it has no usable row
  (an empty file, a header only, or every row bad): scores over 0 examples
  are no scores."""
  if not len(rows):
    raise ValueError(f"The {split} split ({where}) has no usable rows"
                     f"{_skipped(rows)}.")


def read_user_task(train_path: str, validation_path: str, text_field: str,
                   label_field: str, text_pair_field: str = "", *,
                   regression: bool = False, label_order: str = "sorted",
                   label_dir: str = "", name: str = "user",
                   fmt: str = "", write_label_map: bool = True
                   ) -> tuple[TaskSpec, dict[str, Rows]]:
  """The user's task: (spec, {"train": rows, "validation": rows}).

  The label mapping comes from ``label_dir/label_map.json`` when it exists
  (resumed or evaluated runs), else from the train file, and is then written
  there (when ``label_dir`` is set and `write_label_map`; a caller with
  checks of its own writes it after them, :func:`save_label_map`). Either
  path may be "" (not read).
  """
  names = (load_label_map(label_dir) if label_dir else None) or []
  label_map = os.path.join(label_dir, LABEL_MAP_FILE) if names else ""
  if regression and names:
    raise ValueError(f"{label_map} holds class labels but the task is a "
                     "regression; use a fresh workdir.")
  kw = dict(text_pair_field=text_pair_field, regression=regression,
            label_order=label_order, fmt=fmt)
  rows = {}
  if train_path:
    rows["train"], names = read_file(train_path, text_field, label_field,
                                     label_names=names, labels_from=label_map,
                                     **kw)
    if not len(rows["train"]):
      raise ValueError(f"Task file {train_path!r} holds no usable labelled "
                       f"row{_skipped(rows['train'])}.")
  if validation_path:
    if not names and not regression:
      raise ValueError("The task's label mapping is unknown: give the train "
                       f"file or a directory holding {LABEL_MAP_FILE}.")
    rows["validation"], _ = read_file(validation_path, text_field,
                                      label_field, label_names=names, **kw)
  if not regression and not names:
    raise ValueError(f"Task file {train_path!r} holds no usable labelled row.")
  if label_dir and not regression and write_label_map:
    save_label_map(label_dir, names)
  spec = TaskSpec(name, (text_field, text_pair_field) if text_pair_field
                  else (text_field,), label_field, tuple(names),
                  (PEARSON, SPEARMAN) if regression else (ACCURACY,))
  return spec, rows


def load_task(task: str, *, tfds_data_dir: str = "", train_path: str = "",
              validation_path: str = "", text_field: str = "",
              text_pair_field: str = "", label_field: str = "label",
              regression: bool = False, label_order: str = "sorted",
              label_dir: str = "", fmt: str = "", splits: Sequence[str] = (),
              write_label_map: bool = True
              ) -> tuple[TaskSpec, dict[str, Rows]]:
  """One entry for the trainer: ``glue/<name>`` or the user's files.

  GLUE: {"train": ..., each of spec.eval_splits: ...} (or only ``splits``)
  read from ``tfds_data_dir``. Anything else names the user's task, read
  from ``train_path`` / ``validation_path`` by :func:`read_user_task`.
  """
  if task.startswith("glue/"):
    spec = glue_task(task)
    wanted = tuple(splits) or (spec.train_split,) + spec.eval_splits
    return spec, {s: read_glue(spec, s, tfds_data_dir) for s in wanted}
  if not text_field:
    raise ValueError(f"task={task!r} is not a GLUE task, so it reads your "
                     "files: set text_field (and train_path, "
                     "validation_path, label_field).")
  spec, rows = read_user_task(
      train_path, validation_path, text_field, label_field, text_pair_field,
      regression=regression, label_order=label_order, label_dir=label_dir,
      name=task or "user", fmt=fmt, write_label_map=write_label_map)
  if splits:
    rows = {s: rows[s] for s in splits if s in rows}
  return spec, rows
