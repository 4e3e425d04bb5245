"""Pre-tokenized shards: the files, the manifest, the tokenizer's hash.

``python -m bert_jax.pretokenize`` tokenizes a corpus once into a
directory that ``data.sources="shards:DIR"`` trains from
(``shard_source.py``). One shard per source text file, cut into the blocks
of ``data.block_lines`` raw lines the text pipeline cuts it into, each
block stored as ``examples.ExampleBuilder.tokenize_block`` returns it, so
example building, packing and masking run on them as they run on text::

  DIR/manifest.json      what is there (below), written last
  DIR/tokenizer/         a copy of the tokenizer's file(s)
  DIR/NNNNN-NAME.blocks  the blocks' payloads, one after another
  DIR/NNNNN-NAME.index   int64 little-endian: the byte offset of every
                         block, and the end (blocks + 1 entries)

A block's payload is little-endian int32: a header (kept lines n, tokens m,
last document number, raw lines, invalid UTF-8 lines, cut lines, blank
lines), then n line lengths, n hold-out hashes, n document numbers, m token
ids. numpy reads it (:func:`decode_block`); nothing else is needed.

The manifest records the format, the tokenizer (kind, file, case, sha256 of
its bytes, vocabulary size), ``block_lines`` and ``max_line_bytes`` (they
decide the blocks and the ids), and per shard its source file, the source
file's key (the text pipeline's ``data_sources.file_key``: the same file
order and seeds), blocks, documents, lines and tokens. A run refuses shards
of another tokenizer or block shape (``check_run``). No TensorFlow here but
``tf.io.gfile`` for remote paths.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Sequence

import numpy as np

FORMAT = "bert_jax token shards 1"
MANIFEST = "manifest.json"
TOKENIZER_DIR = "tokenizer"
HEADER = 7  # int32 entries before a block's per-line arrays.


def open_file(path: str, mode: str = "rb"):
  if "://" in path:
    import tensorflow as tf  # Remote paths (gs://) need TensorFlow's gfile.
    return tf.io.gfile.GFile(path, mode)
  return open(path, mode)  # pylint: disable=unspecified-encoding


def encode_block(tokens: np.ndarray, lengths: np.ndarray, hashes: np.ndarray,
                 docs: np.ndarray, last_doc: int, line_stats: Sequence[int]
                 ) -> bytes:
  """One block's payload (see the module docstring)."""
  n, m = len(lengths), len(tokens)
  header = np.asarray([n, m, last_doc, *line_stats], np.int32)
  parts = (header, lengths, hashes, docs, tokens)
  return b"".join(np.ascontiguousarray(p, dtype="<i4").tobytes()
                  for p in parts)


def decode_block(payload: bytes) -> dict[str, np.ndarray]:
  """A payload -> tokens (int32 [m]), lengths (int64 [n]), hashes (int64
  [n]), docs (int32 [n]), last_doc (int32), line_stats (int32 [4])."""
  a = np.frombuffer(payload, dtype="<i4")
  n, m = int(a[0]), int(a[1])
  if len(a) != HEADER + 3 * n + m:
    raise ValueError(f"a block of {len(a)} int32 entries does not hold the "
                     f"{n} lines and {m} tokens its header says")
  body = a[HEADER:]
  return dict(lengths=body[:n].astype(np.int64),
              hashes=body[n:2 * n].astype(np.int64),
              docs=body[2 * n:3 * n].astype(np.int32),
              tokens=body[3 * n:].astype(np.int32),
              last_doc=np.int32(a[2]), line_stats=a[3:HEADER].astype(np.int32))


def tokenizer_hash(path: str, kind: str, lower_case: bool) -> str:
  """sha256 of what decides a tokenizer's ids: its kind, its file's bytes
  and (WordPiece) its case folding."""
  case = str(bool(lower_case)) if kind == "wordpiece" else ""
  h = hashlib.sha256(f"{kind}\n{case}\n".encode())
  with open_file(path) as f:
    h.update(f.read())
  return h.hexdigest()


@dataclasses.dataclass(frozen=True)
class Shard:
  name: str  # the files DIR/name.blocks and DIR/name.index
  source: str  # the text file it was made from
  key: int  # data_sources.file_key(source)
  blocks: int
  documents: int
  lines: int
  tokens: int


@dataclasses.dataclass(frozen=True)
class Manifest:
  directory: str
  tokenizer: dict[str, Any]  # kind, file (relative), lower_case, sha256, vocab_size
  block_lines: int
  max_line_bytes: int
  shards: tuple[Shard, ...]

  @property
  def tokenizer_path(self) -> str:
    return os.path.join(self.directory, self.tokenizer["file"])

  @property
  def tokens(self) -> int:
    return sum(s.tokens for s in self.shards)

  @property
  def documents(self) -> int:
    return sum(s.documents for s in self.shards)

  def path(self, shard: Shard, ext: str) -> str:
    return os.path.join(self.directory, f"{shard.name}.{ext}")

  def offsets(self, shard: Shard) -> np.ndarray:
    """int64 [blocks + 1]: where each block starts, and the end."""
    with open_file(self.path(shard, "index")) as f:
      return np.frombuffer(f.read(), dtype="<i8").astype(np.int64)

  def to_json(self) -> dict:
    return dict(format=FORMAT, tokenizer=self.tokenizer,
                block_lines=self.block_lines,
                max_line_bytes=self.max_line_bytes,
                documents=self.documents, tokens=self.tokens,
                shards=[dataclasses.asdict(s) for s in self.shards])


def write_manifest(manifest: Manifest) -> None:
  """DIR/manifest.json, atomically: a directory without one is not done."""
  path = os.path.join(manifest.directory, MANIFEST)
  tmp = f"{path}.tmp{os.getpid()}"
  with open_file(tmp, "w") as f:
    f.write(json.dumps(manifest.to_json(), indent=2) + "\n")
  if "://" in path:
    import tensorflow as tf  # Remote paths need TensorFlow's gfile.
    tf.io.gfile.rename(tmp, path, overwrite=True)
  else:
    os.replace(tmp, path)


def read_manifest(directory: str, field: str = "data.sources") -> Manifest:
  """DIR's manifest; ValueError naming `field` and DIR when there is none
  or it is not one of these shards."""
  path = os.path.join(directory, MANIFEST)
  try:
    with open_file(path, "r") as f:
      raw = json.load(f)
  except (OSError, ValueError) as e:
    kind = ("has no manifest.json (not made by python -m bert_jax."
            "pretokenize, or not finished)" if not exists(path) else
            f"has a manifest.json that is not JSON ({e})")
    raise ValueError(f"{field}: shards:{directory} {kind}.") from None
  if raw.get("format") != FORMAT:
    raise ValueError(f"{field}: shards:{directory}: manifest.json is of "
                     f"format {raw.get('format')!r}, not {FORMAT!r}.")
  return Manifest(directory=directory, tokenizer=dict(raw["tokenizer"]),
                  block_lines=int(raw["block_lines"]),
                  max_line_bytes=int(raw["max_line_bytes"]),
                  shards=tuple(Shard(**s) for s in raw["shards"]))


def exists(path: str) -> bool:
  if "://" in path:
    import tensorflow as tf  # Remote paths need TensorFlow's gfile.
    return tf.io.gfile.exists(path)
  return os.path.exists(path)


def check_run(manifest: Manifest, data, tokenizer_sha256: str,
              tokenizer_path: str, field: str = "data.sources") -> None:
  """ValueError (one line naming `field`, the shards and both values) when
  a run's data config or tokenizer is not what the shards were made with."""
  where = f"{field}: shards:{manifest.directory}"
  want = manifest.tokenizer
  if want["sha256"] != tokenizer_sha256:
    raise ValueError(
        f"{where} were tokenized with {want['file']} ({want['kind']}, sha256 "
        f"{want['sha256'][:12]}), not the run's tokenizer {tokenizer_path} "
        f"(sha256 {tokenizer_sha256[:12]}): their ids would mean other "
        "tokens; pretokenize the corpus with the run's tokenizer.")
  for name in ("block_lines", "max_line_bytes"):
    if int(data[name]) != getattr(manifest, name):
      raise ValueError(
          f"{where} were cut with data.{name}={getattr(manifest, name)}, "
          f"but the config has data.{name}={data[name]}; set "
          f"--config.data.{name}={getattr(manifest, name)}.")
