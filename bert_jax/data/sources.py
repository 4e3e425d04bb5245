"""Where the text comes from: text files, JSONL / Parquet records and TFDS
datasets, mixed by weight.

Source syntax (``config.data.sources``; several separated by ``;``)::

    [text:]GLOB[,GLOB...][@WEIGHT]     # google-research/bert layout files
    jsonl:GLOB[,GLOB...][@WEIGHT]      # one JSON object per line (.gz too)
    parquet:GLOB[,GLOB...][@WEIGHT]    # Parquet files
    tfds:NAME[:SPLIT][@WEIGHT]         # prepared TFDS dataset, text feature
    shards:DIR[@WEIGHT]                # pre-tokenized shards (pretokenize)

JSONL and Parquet hold one document per record, its text in the field
``data.text_field``; they are prepared once into text files of the
google-research layout (``prepared_text``: streamed, in parallel, cached
under ``data.prepared_dir``), which the pipeline then reads like any text
source, so they resume exactly like text files.

Everything here streams: a file list (names only) is the only thing held in
memory; text is read line by line by tf.data.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import os
import re
import zlib
from typing import Iterator, Optional

import tensorflow as tf
from absl import logging

from bert_jax.data import demo_corpus
from bert_jax.data import prepared_text
from bert_jax.data import records

TEXT = "text"
TFDS = "tfds"
SHARDS = "shards"
JSONL, PARQUET = records.JSONL, records.PARQUET


@dataclasses.dataclass(frozen=True)
class Source:
  kind: str  # TEXT, JSONL, PARQUET or TFDS
  spec: str  # comma-separated globs, or a TFDS name (with config/version)
  split: str = "train"
  weight: float = 1.0
  # The record source a TEXT source was prepared from, as messages (and the
  # tokenizer cache) name it: "parquet:GLOB@W (text field 'text')".
  origin: str = ""

  def __str__(self):
    if self.origin:
      return self.origin
    if self.kind == TFDS:
      return f"tfds:{self.spec}:{self.split}@{self.weight:g}"
    return f"{self.kind}:{self.spec}@{self.weight:g}"

  @property
  def name(self) -> str:
    """The source without its weight (phases may weigh it differently):
    what the count of its examples is kept under."""
    return re.sub(r"@[0-9.eE+-]+", "", str(self), count=1)


@dataclasses.dataclass(frozen=True)
class SourcePlan:
  """Which sources a run trains and evaluates on, decided once per run.

  Attributes:
    train: the training sources.
    eval: the eval sources; ``train`` itself when ``eval_from_train``.
    eval_from_train: no eval sources/files and no demo corpus: evaluation
      reads the training sources' held-out documents.
    holds_out: training drops the documents evaluation keeps
      (``eval_from_train`` and ``data.eval_fraction > 0``).
    uses_demo: neither data.sources nor data.train_files is set, so both
      splits are the demo corpus written into the workdir.
  """
  train: tuple[Source, ...]
  eval: tuple[Source, ...]
  eval_from_train: bool
  holds_out: bool
  uses_demo: bool


def plan(data, workdir: Optional[str]) -> SourcePlan:
  """The SourcePlan of a data config (writes the demo corpus when used).

  data.sources wins over data.train_files, data.eval_sources over
  data.eval_files; with neither train field set the demo corpus is written
  under ``workdir`` and its held-out file is the eval split.
  """
  uses_demo = not (data.get("sources", "") or data.get("train_files", ""))
  if data.get("sources", ""):
    train = [prepared(s, data, workdir, "data.sources")
             for s in parse_sources(data.sources, "data.sources")]
  elif data.get("train_files", ""):
    train = [Source(TEXT, data.train_files)]
  else:
    if not workdir:
      raise ValueError("No data.sources and no workdir to write the demo "
                       "corpus into.")
    train_glob, eval_path = demo_corpus.write_demo_corpus(workdir)
    train = [Source(TEXT, train_glob)]
  eval_from_train = False
  if data.get("eval_sources", ""):
    evals = [prepared(s, data, workdir, "data.eval_sources")
             for s in parse_sources(data.eval_sources, "data.eval_sources")]
  elif data.get("eval_files", ""):
    evals = [Source(TEXT, data.eval_files)]
  elif uses_demo:
    evals = [Source(TEXT, eval_path)]
  else:
    evals, eval_from_train = train, True
  return SourcePlan(
      train=tuple(train), eval=tuple(evals), eval_from_train=eval_from_train,
      holds_out=eval_from_train and data.get("eval_fraction", 0.0) > 0,
      uses_demo=uses_demo)


def parse_sources(spec: str, field: str = "data.sources") -> list[Source]:
  """Parses ``a;b;c`` into Sources; raises ValueError naming ``field``."""
  out = []
  for part in (spec or "").split(";"):
    part = part.strip()
    if not part:
      continue
    weight = 1.0
    m = re.fullmatch(r"(.*)@([0-9.eE+-]+)", part)
    if m:
      part = m.group(1)
      try:
        weight = float(m.group(2))
      except ValueError:
        raise ValueError(f"{field}: bad weight in {part!r}.") from None
      if weight <= 0:
        raise ValueError(f"{field}: weight must be > 0 in {part!r}.")
    if part.startswith(SHARDS + ":"):
      directory = part[len(SHARDS) + 1:].rstrip("/")
      if not directory:
        raise ValueError(f"{field}: missing directory in {part!r}.")
      out.append(Source(SHARDS, directory, "", weight))
    elif part.startswith("tfds:"):
      rest = part[len("tfds:"):]
      # NAME may hold '/' (config) and ':' (version: name:1.0.0) is not
      # supported; the last ':'-separated field is the split when present.
      name, _, split = rest.partition(":")
      if not name:
        raise ValueError(f"{field}: missing TFDS name in {part!r}.")
      out.append(Source(TFDS, name, split or "train", weight))
    else:
      kind = records.kind_of(part) or TEXT
      if part.startswith(kind + ":"):
        part = part[len(kind) + 1:]
      if not part:
        raise ValueError(f"{field}: empty file pattern.")
      out.append(Source(kind, part, "", weight))
  return out


def size_bytes(source: Source, data_dir: str = "") -> int:
  """Bytes of a source's text: its files' sizes (a JSONL / Parquet source:
  its prepared text), a TFDS split's size as its info records it."""
  if source.kind == TFDS:
    return int(tfds_builder(source, data_dir).info.splits[
        source.split].num_bytes)
  files, _ = resolve_text_files(source)
  return sum(int(tf.io.gfile.stat(f).length) for f in files)


def mixing_weights(sources, temperature: float = 0.0,
                   data_dir: str = "") -> list[float]:
  """The probability each of `sources` is sampled from (one example at a
  time): with `temperature` 0, its @W weight over their sum; with T > 0,
  (w_i * n_i) ** (1 / T) over the sum of those, n_i its bytes
  (:func:`size_bytes`): T = 1 samples by size, larger T flattens towards
  the weights alone (XLM-R's and mmBERT's exponent alpha is 1 / T)."""
  weights = [float(s.weight) for s in sources]
  if temperature > 0:
    sizes = [size_bytes(s, data_dir) for s in sources]
    top = max(w * n for w, n in zip(weights, sizes))
    weights = [(w * n / top) ** (1.0 / temperature)
               for w, n in zip(weights, sizes)]
  total = sum(weights)
  return [w / total for w in weights]


def file_key(path: str) -> int:
  """A stable per-file integer (from the base name: same on gs:// and local)."""
  return zlib.crc32(os.path.basename(path).encode("utf-8")) & 0x7FFFFFFF


def resolve_text_files(source: Source, field: str = "data.sources"
                       ) -> tuple[list[str], list[str]]:
  """(non-empty files, empty files) matching a text (or record) source;
  sorted.

  Raises ValueError naming the pattern when nothing matches or all files are
  empty.
  """
  files, empty = [], []
  for pattern in source.spec.split(","):
    pattern = pattern.strip()
    if not pattern:
      continue
    try:
      matches = sorted(tf.io.gfile.glob(pattern))
    except tf.errors.OpError as e:
      raise ValueError(f"{field}: cannot list {pattern!r}: {e.message}") from e
    matches = [m for m in matches if not tf.io.gfile.isdir(m)]
    if not matches:
      raise ValueError(f"{field}: no file matches {pattern!r}.")
    for m in matches:
      (empty if tf.io.gfile.stat(m).length == 0 else files).append(m)
  if empty:
    logging.warning("Skipping %d empty file(s) in %s (e.g. %s).", len(empty),
                    source.spec, empty[0])
  if not files:
    raise ValueError(f"{field}: every file matching {source.spec!r} is empty "
                     f"({len(empty)} file(s)).")
  return sorted(set(files)), empty


def tfds_builder(source: Source, data_dir: str):
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  try:
    builder = tfds.builder(source.spec, data_dir=data_dir or None)
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"data.sources: cannot load TFDS dataset {source.spec!r} "
                     f"(data_dir={data_dir!r}): {e}") from e
  if not builder.is_prepared():
    raise ValueError(
        f"data.sources: TFDS dataset {source.spec!r} is not prepared in "
        f"data_dir={builder.data_dir!r}; run tfds build / download_and_prepare "
        "first.")
  return builder


def tfds_documents(source: Source, data_dir: str, text_key: str,
                   process_index: int = 0, process_count: int = 1
                   ) -> tf.data.Dataset:
  """A TFDS split as a dataset of document strings, this process's shard.

  Sharding is by example (``tfds.even_splits``): disjoint, and together the
  whole split.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds_builder(source, data_dir)
  if text_key not in builder.info.features:
    raise ValueError(
        f"data.tfds_text_key={text_key!r} is not a feature of "
        f"{source.spec!r} (features: {list(builder.info.features)}).")
  split = source.split
  if process_count > 1:
    split = tfds.even_splits(split, n=process_count)[process_index]
  ds = builder.as_dataset(split=split, shuffle_files=False,
                          read_config=tfds.ReadConfig(try_autocache=False))
  return ds.map(tf.autograph.experimental.do_not_convert(
      lambda ex: ex[text_key]))


def document_to_lines(doc: tf.Tensor) -> tf.Tensor:
  """In graph: one document string -> its sentences, then "" (the boundary).

  The rule JSONL / Parquet records get when prepared
  (``records.split_document``): split at newlines and sentence ends."""
  text = tf.strings.regex_replace(doc, records.SENTENCE_BREAK, "\\1\n\\2")
  parts = tf.strings.strip(tf.strings.split(text, "\n"))
  parts = tf.boolean_mask(parts, tf.strings.length(parts) > 0)
  return tf.concat([parts, [""]], axis=0)


def python_lines(source: Source, data_dir: str = "", text_key: str = "text",
                 limit: Optional[int] = None,
                 max_line_bytes: Optional[int] = None) -> Iterator[str]:
  """Non-blank lines of a source, streamed in Python (for tokenizer training).

  Like the pipeline (examples.ExampleBuilder): a line is cut to its first
  ``max_line_bytes`` bytes, then invalid UTF-8 is replaced; blank lines are
  skipped.
  """
  n = 0
  cut = slice(0, max_line_bytes)
  if source.kind == SHARDS:
    raise ValueError(f"{source} holds token ids, no text (to train a "
                     "tokenizer on): a run from shards uses their tokenizer.")
  if source.kind == TEXT:
    files, _ = resolve_text_files(source)
    for path in files:
      with tf.io.gfile.GFile(path, "rb") as f:
        for raw in f:
          line = raw[cut].decode("utf-8", errors="replace").strip()
          if line:
            yield line
            n += 1
            if limit is not None and n >= limit:
              return
  else:
    ds = tfds_documents(source, data_dir, text_key).map(
        tf.autograph.experimental.do_not_convert(document_to_lines))
    for lines in ds.as_numpy_iterator():
      for raw in lines:
        line = raw[cut].decode("utf-8", errors="replace").strip()
        if line:
          yield line
          n += 1
          if limit is not None and n >= limit:
            return


def _is_text(raw: bytes, max_line_bytes: Optional[int]) -> bool:
  """UTF-8 (a character cut at max_line_bytes allowed) with a word in it."""
  decoder = codecs.getincrementaldecoder("utf-8")()
  try:
    line = decoder.decode(raw[:max_line_bytes], final=False)
  except UnicodeDecodeError:
    return False
  return any(a.isalnum() and b.isalnum() for a, b in zip(line, line[1:]))


def check_usable(source: Source, max_line_bytes: Optional[int] = None,
                 field: str = "data.sources", sample: int = 256,
                 min_fraction: float = 0.05) -> None:
  """Raises ValueError when a text source holds (almost) no text.

  Reads the first `sample` non-empty lines of the source's files; a NUL
  byte in any of them, or fewer than `min_fraction` of them being UTF-8 with
  a word in it, means binary or wrongly encoded input, which would
  otherwise train on replacement characters and symbol tables. TFDS
  sources are not checked.
  """
  if source.kind != TEXT:
    return
  files, _ = resolve_text_files(source, field)
  n = good = 0
  for path in files:
    with tf.io.gfile.GFile(path, "rb") as f:
      for number, raw in enumerate(f, 1):
        if b"\0" in raw:
          # Text never holds a NUL byte; programs, images, archives, Parquet
          # and UTF-16 do, between runs of readable strings that would
          # otherwise pass for sentences (git and grep decide "binary" so).
          raise ValueError(
              f"{field}: {source} yields no usable sentences: {path} is a "
              f"binary file (NUL bytes in line {number}), not UTF-8 text; "
              "point it at UTF-8 text files with "
              "one sentence per line (JSONL or Parquet records: use a "
              "jsonl: or parquet: source).")
        if not raw.strip():
          continue
        n += 1
        good += _is_text(raw, max_line_bytes)
        if n >= sample:
          break
    if n >= sample:
      break
  if n and good < min_fraction * n:
    raise ValueError(
        f"{field}: {source} yields no usable sentences: {good} of the first "
        f"{n} lines of {files[0] if len(files) == 1 else f'its {len(files)} files'} "
        "are UTF-8 text (the rest invalid UTF-8, e.g. a binary file); point it "
        "at UTF-8 text files with one sentence per line.")


# -----------------------------------------------------------------------------
# JSONL / Parquet records, prepared into text files once.
# -----------------------------------------------------------------------------
def prepared(source: Source, data, workdir: Optional[str],
             field: str = "data.sources") -> Source:
  """`source` itself, or for a JSONL / Parquet source the text source of its
  prepared files (``prepared_text.prepare``: made where missing, cached under
  ``data.prepared_dir``, default WORKDIR/prepared)."""
  if source.kind not in records.KINDS:
    return source
  root = data.get("prepared_dir", "") or (
      os.path.join(workdir, "prepared") if workdir else "")
  if not root:
    raise ValueError(f"{field}: {source} needs data.prepared_dir or a workdir "
                     "to prepare its records into text files.")
  return _prepared(source, data.get("text_field", "text") or "text", root,
                   field)


def prepare_records(data, workdir: Optional[str]) -> None:
  """Prepares every JSONL / Parquet source of `data` (data.sources and
  data.eval_sources) as :func:`plan` reads them, and writes nothing else
  (no demo corpus): where a run converts its records before it records
  anything of its own."""
  for field in ("sources", "eval_sources"):
    for s in parse_sources(data.get(field, ""), f"data.{field}"):
      prepared(s, data, workdir, f"data.{field}")


def check_records(source: Source, path: str, text_field: str,
                  field: str = "data.sources") -> None:
  """ValueError naming the problem when `path`, a file of a JSONL / Parquet
  `source`, is not of its kind or lacks `text_field` (Parquet's schema, a
  JSONL file's first record; nothing else is read)."""
  if source.kind in records.KINDS:
    try:
      records.check_file(path, source.kind, text_field)
    except records.RecordFileError as e:
      name = prepared_text.describe(source.kind, source.spec, source.weight,
                                    text_field)
      raise ValueError(f"{field}: {name}: {e}") from None


@functools.lru_cache(maxsize=64)
def _prepared(source: Source, text_field: str, root: str, field: str,
              workers: int = 0) -> Source:
  """Once per process (the plan is made several times per run)."""
  inputs, _ = resolve_text_files(source, field)
  done = prepared_text.prepare(
      source.kind, source.spec, inputs, text_field, root, field=field,
      weight=source.weight, workers=workers)
  return Source(TEXT, done.glob, "", source.weight, done.name)
