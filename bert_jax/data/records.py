"""JSONL and Parquet records as pretraining text: one document per record.

Corpora arrive as record files (Hugging Face ``datasets`` exports,
Wikipedia / FineWeb-style dumps): one JSON object per line (``.jsonl``,
``.jsonl.gz``) or Parquet, the document's text in one field. The pretraining
pipeline reads text files in google-research/bert layout (one sentence per
line, a blank line after each document), whose tf.data iterator state a
checkpoint restores exactly. So a record file becomes one such text file
(``convert_file``): each record's text split into sentences by
:func:`split_document` (at its newlines, and at sentence ends: the rule TFDS
documents get inside the pipeline), records with no text skipped. Reading
streams (one JSON line, or one Parquet record batch of the text column, at a
time); ``sources.prepare_records`` converts many files in parallel worker
processes and caches the result.

Parquet is read with pyarrow (installed with tensorflow-datasets).
"""

from __future__ import annotations

import gzip
import json
import os
import re
from typing import IO, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

JSONL, PARQUET = "jsonl", "parquet"
KINDS = (JSONL, PARQUET)
# Bumped when the text a record becomes changes (cached outputs are redone).
VERSION = 1
_SUFFIXES = {JSONL: (".jsonl.gz", ".json.gz", ".ndjson.gz", ".jsonl",
                     ".json", ".ndjson"),
             PARQUET: (".parquet", ".parq", ".pq")}
_PARQUET_BATCH = 1024  # Records read at a time.

# End of a sentence inside a line: . ! ? (and a closing quote or bracket),
# whitespace, then an upper-case letter, a digit or an opening quote or
# bracket. One pattern for both readers: RE2 in the pipeline's graph
# (sources.document_to_lines) and Python's re here, whose classes agree on
# it (\s spelled out as RE2's ASCII whitespace).
SENTENCE_BREAK = r"([.!?][\"')\]]?)[\t\n\f\r ]+([A-Z0-9\"'(\[])"
_BREAK = re.compile(SENTENCE_BREAK)
_ASCII_SPACE = " \t\n\v\f\r"  # What tf.strings.strip strips.


class RecordFileError(ValueError):
  """A record file that cannot become text (the message names file and
  record)."""


def split_document(text: str) -> list[str]:
  """A document's sentences: split at newlines and at sentence ends, each
  stripped, blank ones dropped (as sources.document_to_lines in graph)."""
  text = _BREAK.sub("\\1\n\\2", text)
  parts = (p.strip(_ASCII_SPACE) for p in text.split("\n"))
  return [p for p in parts if p]


def kind_of(spec: str) -> str | None:
  return next((k for k in KINDS if spec.startswith(k + ":")), None)


def output_name(path: str, kind: str) -> str:
  """corpus/shard-00001.parquet -> shard-00001.txt: the stem, so the text
  file keys the pipeline's per-file seeds as a text file of that name."""
  base = os.path.basename(path)
  for suffix in _SUFFIXES[kind]:
    if base.lower().endswith(suffix):
      return base[:-len(suffix)] + ".txt"
  return base + ".txt"


def _open(path: str) -> IO[bytes]:
  if "://" in path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow: gs:// paths only)
    f = tf.io.gfile.GFile(path, "rb")
  else:
    f = open(path, "rb")
  return gzip.GzipFile(fileobj=f) if path.lower().endswith(".gz") else f


# -----------------------------------------------------------------------------
# Documents of one file, streamed.
# -----------------------------------------------------------------------------
def _jsonl_texts(path: str, text_field: str, limit: int | None = None
                 ) -> Iterator[str | None]:
  with _open(path) as f:
    n = 0
    for number, raw in enumerate(f, 1):
      if not raw.strip():
        continue
      try:
        record = json.loads(raw)
      except (ValueError, UnicodeDecodeError) as e:
        if isinstance(e, json.JSONDecodeError):  # "Invalid ... at" + column
          why = f"{e.msg.removesuffix(' at')} at column {e.colno}"
        elif isinstance(e, UnicodeDecodeError):
          why = f"invalid UTF-8 at byte {e.start}"
        else:
          why = str(e)
        raise RecordFileError(
            f"{path} line {number} is not a JSON object ({why}): a JSONL "
            "file holds one JSON object per line.") from None
      if not isinstance(record, dict):
        raise RecordFileError(
            f"{path} line {number} is a JSON {type(record).__name__}, not an "
            "object: a JSONL file holds one JSON object per line.")
      if text_field not in record:
        raise RecordFileError(
            f"{path} line {number} has no field {text_field!r} (it has "
            f"{', '.join(map(repr, list(record)[:10])) or 'no fields'}); set "
            "data.text_field to the field that holds the document's text.")
      yield _text(record[text_field], path, f"line {number}", text_field)
      n += 1
      if limit is not None and n >= limit:
        return


def _parquet_file(path: str, text_field: str):
  """(ParquetFile, its open file); RecordFileError naming what is wrong."""
  f = _open(path)
  try:
    pf = pq.ParquetFile(f)
  except (pa.ArrowException, OSError) as e:
    f.close()
    raise RecordFileError(f"{path} is not a readable Parquet file "
                          f"({str(e).splitlines()[0]}).") from None
  schema = pf.schema_arrow
  if text_field not in schema.names:
    f.close()
    raise RecordFileError(
        f"{path} has no column {text_field!r} (columns: "
        f"{', '.join(map(repr, schema.names[:10]))}); set data.text_field to "
        "the column that holds the document's text.")
  kind = schema.field(text_field).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
    f.close()
    raise RecordFileError(f"Column {text_field!r} of {path} holds {kind}, not "
                          "strings: set data.text_field to the text column.")
  return pf, f


def _parquet_texts(path: str, text_field: str, limit: int | None = None
                   ) -> Iterator[str | None]:
  pf, f = _parquet_file(path, text_field)
  with f:
    n = 0
    try:
      for batch in pf.iter_batches(batch_size=_PARQUET_BATCH,
                                   columns=[text_field]):
        for text in batch.column(0).to_pylist():
          yield text
          n += 1
          if limit is not None and n >= limit:
            return
    except (pa.ArrowException, OSError) as e:
      raise RecordFileError(f"{path} cannot be read after record {n} "
                            f"({str(e).splitlines()[0]}).") from None


def _text(value, path: str, where: str, text_field: str) -> str | None:
  if value is None or isinstance(value, str):
    return value
  raise RecordFileError(
      f"{path} {where}: field {text_field!r} is a {type(value).__name__}, not "
      "a string; set data.text_field to the field that holds the text.")


def texts(path: str, kind: str, text_field: str, limit: int | None = None
          ) -> Iterator[str | None]:
  """The text field of each record of `path` (None where it is null)."""
  read = _jsonl_texts if kind == JSONL else _parquet_texts
  return read(path, text_field, limit)


def check_file(path: str, kind: str, text_field: str) -> None:
  """Cheap check before anything is converted: Parquet's schema (its footer
  alone), a JSONL file's first record. RecordFileError when wrong."""
  if kind == PARQUET:
    _parquet_file(path, text_field)[1].close()
  else:
    for _ in texts(path, kind, text_field, limit=1):
      pass


def convert_file(path: str, kind: str, text_field: str, out_path: str
                 ) -> dict:
  """Writes `path`'s records as text (one sentence per line, a blank line
  between documents) to `out_path` (a local path or any tf.io.gfile
  one). Returns counts: records, documents, sentences."""
  if "://" in out_path:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow: gs:// paths only)
    out = tf.io.gfile.GFile(out_path, "wb")
  else:
    out = open(out_path, "wb")
  records = documents = sentences = 0
  with out:
    for text in texts(path, kind, text_field):
      records += 1
      # A NUL (JSON's \u0000) would make the text file read as binary.
      lines = split_document(text.replace("\0", " ")) if text else []
      if lines:
        # A blank line between documents, as google-research/bert's files.
        # Lone surrogates (JSON's \ud800) are not UTF-8: written as '?'.
        text = ("\n" if documents else "") + "\n".join(lines) + "\n"
        out.write(text.encode("utf-8", "replace"))
        documents += 1
        sentences += len(lines)
  return dict(records=records, documents=documents, sentences=sentences)
