"""Where sentence pairs come from: the user's files, or GLUE's through TFDS.

A row holds texts in named columns (an anchor and its positive, hard
negatives after them; or sentence1 and sentence2) and optionally a score
(STS's 0-5 similarity, a paraphrase label 0 / 1). Files are CSV or TSV with
a header (TSV read with ``csv.QUOTE_NONE``: sentences hold quote
characters) or JSONL, one object per line. GLUE ``stsb`` and ``mrpc`` come
from a prepared TFDS directory (``task_sources.read_glue``: their label is
the score).

Every row must be whole: a missing column, a row with another number of
cells, an empty text, a score that is no number or lies outside the
declared range is bad input, and one ValueError names the file, the line
and the field before anything is written (a pair with an empty side would
train the encoder toward a vector of [CLS] [SEP]).
"""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Sequence

import numpy as np

from bert_jax.data import task_sources

# GLUE tasks that are sentence pairs with a score: name -> the score's range.
GLUE_PAIRS = {"glue/stsb": (0.0, 5.0), "glue/mrpc": (0.0, 1.0)}


@dataclasses.dataclass
class PairRows:
  """One split in memory: text columns, scores (or None), source rows."""
  texts: tuple[np.ndarray, ...]  # per column, object arrays of str
  scores: np.ndarray | None  # float32 [N]
  where: list[str]  # "path:line" (or "tfds:<name>:<split>:<i>") per row

  def __len__(self):
    return len(self.where)

  def select(self, keep: np.ndarray) -> "PairRows":
    """The rows where `keep` is True."""
    idx = np.flatnonzero(keep)
    return PairRows(tuple(t[idx] for t in self.texts),
                    None if self.scores is None else self.scores[idx],
                    [self.where[i] for i in idx])


def _read_text(path: str) -> str:
  with task_sources.open_file(path) as f:
    return f.read().decode("utf-8-sig")  # Excel writes a BOM.


def _records(path: str, fields: Sequence[str]):
  """(line number, {field: str}) per data row; ValueError naming the file
  (and line) for a missing column or a malformed row."""
  text = _read_text(path)
  fmt = task_sources.file_format(path)
  if fmt == "jsonl":
    # Lines split at "\n" only, not splitlines: U+2028 is text.
    for n, obj in task_sources.json_lines(path, text.split("\n")):
      if not isinstance(obj, dict):
        raise ValueError(f"{path}:{n}: not a JSON object.")
      missing = [k for k in fields if k not in obj]
      if missing:
        raise ValueError(f"{path}:{n}: no field {missing[0]!r} (it has "
                         f"{sorted(obj)}).")
      yield n, {k: "" if obj[k] is None else str(obj[k]) for k in fields}
    return
  reader = csv.reader(io.StringIO(text, newline=""),
                      delimiter="\t" if fmt == "tsv" else ",",
                      quoting=csv.QUOTE_NONE if fmt == "tsv" else
                      csv.QUOTE_MINIMAL)
  header = next(reader, None)
  if header is None:
    raise ValueError(f"{path} is empty: it needs a header row naming "
                     f"{', '.join(fields)}.")
  missing = [k for k in fields if k not in header]
  if missing:
    raise ValueError(f"{path}: no column {missing[0]!r} in its header "
                     f"{header}.")
  pos = {k: header.index(k) for k in fields}
  for n, row in enumerate(reader, 2):
    if not row or (len(row) == 1 and not row[0].strip()):
      continue
    if len(row) != len(header):
      raise ValueError(f"{path}:{n}: {len(row)} cells, the header has "
                       f"{len(header)}.")
    yield n, {k: row[i] for k, i in pos.items()}


def check_range(score_range: Sequence[float]) -> tuple[float, float] | None:
  """A declared (low, high) score range, or None for ()."""
  if not len(score_range):
    return None
  if len(score_range) != 2 or not score_range[0] < score_range[1]:
    raise ValueError(f"task.score_range={tuple(score_range)} must be (low, "
                     "high) with low < high, or () for no check.")
  return float(score_range[0]), float(score_range[1])


def read_file(path: str, columns: Sequence[str], score_field: str = "", *,
              score_range: Sequence[float] = ()) -> PairRows:
  """Every row of a pairs file: texts of `columns` and, with `score_field`,
  the score (within `score_range` when given). ValueError naming the file,
  line and field for a missing column, an empty text or a bad score."""
  bounds = check_range(score_range)
  fields = list(columns) + ([score_field] if score_field else [])
  texts = [[] for _ in columns]
  scores, where = [], []
  for n, rec in _records(path, fields):
    for col, out in zip(columns, texts):
      if not rec[col].strip():
        raise ValueError(f"{path}:{n}: empty text in {col!r}.")
      out.append(rec[col])
    if score_field:
      try:
        score = float(rec[score_field])
      except ValueError:
        raise ValueError(f"{path}:{n}: {score_field}={rec[score_field]!r} is "
                         "not a number.") from None
      if not np.isfinite(score) or bounds and not (
          bounds[0] <= score <= bounds[1]):
        raise ValueError(f"{path}:{n}: {score_field}={score:g} is outside "
                         f"task.score_range={bounds}.")
      scores.append(score)
    where.append(f"{path}:{n}")
  if not where:
    raise ValueError(f"{path} has no data rows.")
  return PairRows(tuple(np.array(t, object) for t in texts),
                  np.asarray(scores, np.float32) if score_field else None,
                  where)


def read_glue(name: str, split: str, data_dir: str) -> PairRows:
  """GLUE stsb / mrpc from a prepared TFDS directory: (sentence1,
  sentence2) and the label as the score."""
  if name not in GLUE_PAIRS:
    raise ValueError(f"task.name={name!r}: the GLUE tasks of sentence pairs "
                     f"are {', '.join(GLUE_PAIRS)}; other data reads your "
                     "files (task.train_file, task.validation_file).")
  rows = task_sources.read_glue(task_sources.glue_task(name), split, data_dir)
  return PairRows((rows.text_a, rows.text_b), rows.labels.astype(np.float32),
                  [f"tfds:{name}:{split}:{i}" for i in rows.index])
