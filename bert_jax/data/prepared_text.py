"""JSONL / Parquet sources prepared into text files once, and cached.

The pretraining pipeline reads text files (one sentence per line, a blank
line after each document), whose iterator state resumes exactly; a record
source becomes such files here (``records.convert_file`` per input file),
then is read like any text source (``sources.prepared``). Streaming: one
record (or Parquet record batch) at a time per file; parallel: one worker
process per file once the inputs are large; cached: a rerun converts only
new or changed inputs, so a resumed run reads the very files it trained on.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import multiprocessing
import os
import time
from typing import Optional

import jax
import tensorflow as tf
from absl import logging

from bert_jax.data import records

# Record files this size and up (in total) are converted by worker processes,
# one file each; smaller ones in this process (a worker starts in seconds).
_PARALLEL_BYTES = 64 << 20
_MARKER = "PREPARED.json"


@dataclasses.dataclass(frozen=True)
class Prepared:
  """What `prepare` made: the text files' glob and the source's name, and
  what this call converted."""
  glob: str
  name: str
  files: int  # Input files, all prepared now.
  converted: int = 0  # Of them, converted by this call.
  records: int = 0
  documents: int = 0
  sentences: int = 0
  seconds: float = 0.0

  def __str__(self):
    return (f"{self.name}: {self.converted} of {self.files} file(s) "
            f"converted ({self.records} records, {self.documents} documents, "
            f"{self.sentences} sentences) in {self.seconds:.1f}s; text files "
            f"{self.glob}")


def describe(kind: str, spec: str, weight: float, text_field: str) -> str:
  """How messages (and the tokenizer cache) name a record source."""
  return f"{kind}:{spec}@{weight:g} (text field {text_field!r})"


def prepare(kind: str, spec: str, inputs: list[str], text_field: str,
            root: str, *, field: str = "data.sources", weight: float = 1.0,
            workers: int = 0, process_index: Optional[int] = None
            ) -> Prepared:
  """Text files of a JSONL / Parquet source's records (`kind`, `spec`; its
  files `inputs`), under `root`.

  ``ROOT/<kind>-<hash of the source and field>/<hash of the input's
  directory>/<input stem>.txt``, one per input file, each beside a
  ``.source.json`` naming the input (size, mtime) it was made from: a rerun
  converts only inputs that are new or changed and drops outputs whose input
  is gone. Every input is checked (Parquet schema, the first JSONL record)
  before anything is written; the conversion goes to a staging directory
  published when all of it succeeded, so a bad record leaves the prepared
  files as they were. `workers` processes convert (0: the CPU count when the
  inputs are large, else this process). In a multi-process run process 0
  prepares and the others wait for its marker.

  The name is the record source's ("parquet:GLOB@W (text field 'text')"):
  errors and the tokenizer cache name what the user wrote.
  """
  origin = describe(kind, spec, weight, text_field)
  key = hashlib.sha256(f"{kind}:{spec}|{text_field}|"
                       f"{records.VERSION}".encode()).hexdigest()[:12]
  out_dir = os.path.join(root, f"{kind}-{key}")
  stats = [tf.io.gfile.stat(p) for p in inputs]
  wanted = {}  # output path -> what its .source.json must say
  for path, st in zip(inputs, stats):
    sub = hashlib.sha256(os.path.dirname(path).encode()).hexdigest()[:8]
    out = os.path.join(out_dir, sub, records.output_name(path, kind))
    if out in wanted:
      raise ValueError(f"{field}: {origin}: {path} and "
                       f"{wanted[out]['input']} would both become {out}.")
    wanted[out] = dict(input=path, size=int(st.length),
                       mtime_nsec=int(st.mtime_nsec), text_field=text_field,
                       version=records.VERSION)
  fingerprint = hashlib.sha256(json.dumps(
      sorted(wanted.items()), sort_keys=True).encode()).hexdigest()
  result = Prepared(os.path.join(out_dir, "*", "*.txt"), origin, len(wanted))
  if process_index is None:
    process_index = jax.process_index()
  marker = os.path.join(out_dir, _MARKER)
  if process_index != 0:
    _wait_for_marker(marker, fingerprint, origin)
    return result
  if _read_json(marker).get("fingerprint") == fingerprint:
    return result
  todo = [out for out, want in wanted.items()
          if _read_json(out + ".source.json") != want]
  try:
    for out in todo:  # Every input's schema / first record, before writing.
      records.check_file(wanted[out]["input"], kind, text_field)
  except records.RecordFileError as e:
    raise ValueError(f"{field}: {origin}: {e}") from None
  start = time.time()
  counts = _convert(todo, wanted, kind, text_field, root, out_dir, field,
                    origin, workers)
  for path in tf.io.gfile.glob(os.path.join(out_dir, "*", "*.txt")):
    if path not in wanted:  # Its input is gone from the source.
      tf.io.gfile.remove(path)
      if tf.io.gfile.exists(path + ".source.json"):
        tf.io.gfile.remove(path + ".source.json")
  _write_json(marker, dict(fingerprint=fingerprint, source=origin))
  result = dataclasses.replace(
      result, converted=len(todo), seconds=time.time() - start,
      **{k: sum(c[k] for c in counts)
         for k in ("records", "documents", "sentences")})
  if todo:
    logging.info("Prepared %s.", result)
  return result


def _convert(todo, wanted, kind, text_field, root, out_dir, field, origin,
             workers) -> list[dict]:
  """Convert the `todo` outputs in a staging directory beside `out_dir`;
  publish them once all succeeded and some text exists. On failure nothing
  is left (not even `root`, when it was made for this)."""
  if not todo:
    return []
  root_existed = tf.io.gfile.isdir(root)
  staging = f"{out_dir}.staging-{os.getpid()}-{int(time.time())}"
  jobs = [(wanted[out]["input"], kind, text_field,
           os.path.join(staging, f"{i}.txt")) for i, out in enumerate(todo)]
  tf.io.gfile.makedirs(staging)
  published = False
  try:
    total = sum(wanted[out]["size"] for out in todo)
    workers = workers or (os.cpu_count() or 1
                          if total >= _PARALLEL_BYTES else 1)
    workers = min(workers, len(jobs))
    if workers > 1:
      with concurrent.futures.ProcessPoolExecutor(
          workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        counts = list(pool.map(records.convert_file, *zip(*jobs)))
    else:
      counts = [records.convert_file(*job) for job in jobs]
    if not sum(c["documents"] for c in counts) and not _any_text(
        [out for out in wanted if out not in todo]):
      raise ValueError(
          f"{field}: {origin}: no record has text in field {text_field!r} "
          f"({sum(c['records'] for c in counts)} records, all empty or "
          "null).")
    for (_, _, _, tmp), out in zip(jobs, todo):
      tf.io.gfile.makedirs(os.path.dirname(out))
      tf.io.gfile.rename(tmp, out, overwrite=True)
      _write_json(out + ".source.json", wanted[out])
    published = True
  except records.RecordFileError as e:
    raise ValueError(f"{field}: {origin}: {e}") from None
  finally:
    if tf.io.gfile.exists(staging):
      tf.io.gfile.rmtree(staging)
    if not published and not root_existed and tf.io.gfile.isdir(root) and (
        not tf.io.gfile.listdir(root)):
      tf.io.gfile.rmtree(root)
  return counts


def _any_text(wanted) -> bool:
  """Whether any prepared output (converted now or before) holds text."""
  return any(tf.io.gfile.exists(out) and tf.io.gfile.stat(out).length
             for out in wanted)


def _read_json(path: str) -> dict:
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  except (tf.errors.NotFoundError, ValueError):
    return {}


def _write_json(path: str, value: dict) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with tf.io.gfile.GFile(tmp, "w") as f:
    json.dump(value, f, sort_keys=True)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def _wait_for_marker(marker: str, fingerprint: str, origin: str,
                     timeout: float = 3600) -> None:
  deadline = time.time() + timeout
  while _read_json(marker).get("fingerprint") != fingerprint:
    if time.time() > deadline:
      raise ValueError(f"Timed out waiting for process 0 to prepare {origin} "
                       f"({marker}).")
    time.sleep(2)
