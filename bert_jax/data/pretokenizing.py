"""Tokenize a corpus once into shards (``shard_format``), in parallel over
the local cores (``python -m bert_jax.pretokenize``).

Each source text file becomes one shard, written by one worker process
(spawned: TensorFlow and the tokenizer are loaded once per worker): the
file is read, cut into blocks and tokenized by the text pipeline's own
graph (``TextLineDataset`` + ``ExampleBuilder.tokenize_block``), so the
blocks are exactly those a run from the text reads. Files are spread over
the workers, so a corpus of one huge file uses one core. The manifest is
written last: a directory without one is not finished.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os

import numpy as np
import tensorflow as tf
from absl import logging

from bert_jax.data import examples
from bert_jax.data import shard_format
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers

_WORKER = {}


def _start_worker(kind: str, path: str, lower_case: bool, block_lines: int,
                  max_line_bytes: int) -> None:
  """Per worker: the tokenizer and the traced block tokenizer."""
  try:
    tf.config.set_visible_devices([], "GPU")
  except (RuntimeError, ValueError):
    pass
  tok = tokenizers.load(path, kind, lower_case)
  builder = examples.ExampleBuilder(tok, examples.ExampleOptions(
      seq_length=8, objective="packed", short_seq_prob=0.0,
      max_line_bytes=max_line_bytes, block_lines=block_lines))

  def tokenize(raw):
    out = builder.tokenize_block(raw)
    return dict(ids=out["tokens"].flat_values,
                lengths=out["tokens"].row_lengths(), hashes=out["hashes"],
                docs=out["docs"], last_doc=out["last_doc"],
                line_stats=out["line_stats"])

  _WORKER.update(block_lines=block_lines, fn=tf.function(
      tokenize, autograph=False,
      input_signature=[tf.TensorSpec([None], tf.string)]))


def _one_file(task: tuple[int, str, str]) -> dict:
  """Shard `index` of text file `path` into `out_dir`; its manifest entry."""
  index, path, out_dir = task
  name = f"{index:05d}-{os.path.basename(path)}"
  lines = tf.data.TextLineDataset(path).concatenate(
      tf.data.Dataset.from_tensors(tf.constant("")))
  ds = lines.batch(_WORKER["block_lines"]).map(
      _WORKER["fn"], num_parallel_calls=2, deterministic=True).prefetch(2)
  offsets, documents, kept, tokens = [0], 0, 0, 0
  last_global, base = -1, 0
  blocks_path = os.path.join(out_dir, f"{name}.blocks")
  with shard_format.open_file(blocks_path + ".tmp", "wb") as f:
    for block in ds.as_numpy_iterator():
      payload = shard_format.encode_block(
          block["ids"], block["lengths"], block["hashes"], block["docs"],
          int(block["last_doc"]), block["line_stats"])
      f.write(payload)
      offsets.append(offsets[-1] + len(payload))
      # Documents: distinct runs of lines between boundaries, across blocks
      # (a block's document numbers count its boundaries from 0).
      for d in (base + block["docs"]).tolist():
        documents += d != last_global
        last_global = d
      base += int(block["last_doc"])
      kept += len(block["lengths"])
      tokens += len(block["ids"])
  index_path = os.path.join(out_dir, f"{name}.index")
  with shard_format.open_file(index_path, "wb") as f:
    f.write(np.asarray(offsets, "<i8").tobytes())
  tf.io.gfile.rename(blocks_path + ".tmp", blocks_path, overwrite=True)
  return dict(name=name, source=path, key=data_sources.file_key(path),
              blocks=len(offsets) - 1, documents=documents, lines=kept,
              tokens=tokens)


def text_files(data, workdir: str) -> list[str]:
  """The training sources' text files (JSONL / Parquet prepared into text
  first); ValueError naming data.sources for a source that has no files
  (TFDS, shards)."""
  plan = data_sources.plan(data, workdir)
  files = []
  for s in plan.train:
    if s.kind != data_sources.TEXT:
      raise ValueError(f"data.sources: {s} is not made of text files; "
                       "pretokenize reads text, JSONL or Parquet sources.")
    files += data_sources.resolve_text_files(s)[0]
  return sorted(set(files))


def _copy_tokenizer(spec, out_dir: str) -> str:
  """The tokenizer's file(s) into out_dir/tokenizer/; its path there."""
  target = os.path.join(out_dir, shard_format.TOKENIZER_DIR)
  tf.io.gfile.makedirs(target)
  names = [os.path.basename(spec.path)]
  if spec.kind == "hf_json":
    names.append("tokenizer_config.json")  # Its special tokens' names.
  for name in names:
    src = os.path.join(os.path.dirname(spec.path), name)
    if tf.io.gfile.exists(src):
      tf.io.gfile.copy(src, os.path.join(target, name), overwrite=True)
  return os.path.join(shard_format.TOKENIZER_DIR, names[0])


def write_shards(data, spec, out_dir: str, workers: int = 0
                 ) -> shard_format.Manifest:
  """Shards of `data`'s training sources tokenized with `spec` (a
  TokenizerSpec: kind, path, lower_case) into `out_dir`, `workers`
  processes at a time (0: one per core)."""
  files = text_files(data, out_dir)
  tok = tokenizers.load(spec.path, spec.kind, spec.lower_case)
  tf.io.gfile.makedirs(out_dir)
  tokenizer = dict(kind=spec.kind, file=_copy_tokenizer(spec, out_dir),
                   lower_case=bool(spec.lower_case),
                   sha256=shard_format.tokenizer_hash(spec.path, spec.kind,
                                                      spec.lower_case),
                   vocab_size=int(tok.vocab_size))
  workers = max(1, min(int(workers) or os.cpu_count() or 1, len(files)))
  logging.info("Tokenizing %d files with %s on %d processes into %s.",
               len(files), spec.path, workers, out_dir)
  with concurrent.futures.ProcessPoolExecutor(
      workers, mp_context=multiprocessing.get_context("spawn"),
      initializer=_start_worker,
      initargs=(spec.kind, spec.path, bool(spec.lower_case),
                int(data.block_lines), int(data.max_line_bytes))) as pool:
    shards = list(pool.map(_one_file, [(i, f, out_dir)
                                       for i, f in enumerate(files)]))
  manifest = shard_format.Manifest(
      directory=out_dir, tokenizer=tokenizer,
      block_lines=int(data.block_lines),
      max_line_bytes=int(data.max_line_bytes),
      shards=tuple(shard_format.Shard(**s) for s in shards))
  shard_format.write_manifest(manifest)
  return manifest

