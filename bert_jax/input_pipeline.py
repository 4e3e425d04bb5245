"""BERT pretraining input pipeline: text -> tokens -> examples -> masked batches.

Everything runs inside one tf.data graph with stateless random ops, so the
iterator state (including shuffle buffers) can be saved with each checkpoint
and a resumed run sees exactly the batches the uninterrupted run would have.

Flow per source (see ``data_sources``)::

  files (this host's share, reshuffled per epoch by a stateless shuffle)
    -> interleave(TextLineDataset + a trailing "" = end of document)
    -> blocks of ``data.block_lines`` consecutive lines of one file
    -> ExampleBuilder (one vectorized map per block): clean lines (invalid
       UTF-8 replaced, long lines cut), tokenize (SentencePiece / WordPiece),
       then build NSP / SOP pairs or RoBERTa-style packed sequences
    -> unbatch -> [shard by example when there are too few files]
  -> mix sources by weight -> shuffle(examples) -> batch(per-host batch)
  -> Masker (in graph, seeded by (seed, batch index): dynamic masking)
  -> prefetch

Memory is bounded by the blocks in flight, the shuffle buffer and the prefetch
buffer; the corpus is never held (the file list is).

Pair building follows google-research/bert's create_pretraining_data.py per
document: sentences are accumulated into a chunk until it reaches the target
length (``max_num_tokens = seq_length - 3``, or with probability
``short_seq_prob`` a random length in [2, max_num_tokens]); the chunk is split
at a random sentence boundary into A and B; with probability 0.5 B is replaced
by a segment of another document (NSP label 1), or for SOP A and B are swapped
(label 1); the pair is truncated to max_num_tokens by removing tokens from the
longer side, at the front or back at random. Differences from the reference,
all to stay streaming and vectorized: the random segment comes from another
document of the same block of lines (if the block holds a single long
document, from a chunk of it at least 3 chunks away); a chunk of a single
sentence is split inside the sentence; the sentences left over when B is
random are not put back.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Iterator, Optional

from absl import logging
import ml_collections
import numpy as np
import tensorflow as tf

from bert_jax import config_lib
from bert_jax import data_sources
from bert_jax import demo_corpus
from bert_jax import features
from bert_jax import masking
from bert_jax import tokenizers

AUTOTUNE = tf.data.AUTOTUNE
try:  # The pipeline runs on the host CPU: keep TF off the accelerators JAX uses.
  tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):  # already initialized
  pass
# Autograph adds seconds of tracing per function and none of this code needs it.
_nc = tf.autograph.experimental.do_not_convert
NSP, SOP, PACKED = config_lib.NSP, config_lib.SOP, config_lib.PACKED
FEATURES = features.PRETRAINING_NAMES
# Per-block counters carried alongside examples (summed by the iterator).
STATS = ("lines", "invalid_utf8_lines", "long_lines", "long_sentences",
         "blank_lines", "documents", "examples")
_STATS_KEY = "_stats"
_MAX_EPOCHS = 1 << 40


# -----------------------------------------------------------------------------
# Config helpers.
# -----------------------------------------------------------------------------


objective = config_lib.sentence_objective


def _seed(config, *salt: Any) -> np.ndarray:
  """A [2] int64 seed derived from config.train.seed and a salt."""
  ints = [int(config.train.seed)] + [
      int.from_bytes(hashlib.sha256(str(s).encode()).digest()[:4], "little")
      for s in salt]
  return np.random.SeedSequence(ints).generate_state(2, np.uint32).astype(
      np.int64)


def _fold(seed: tf.Tensor, *data: Any) -> tf.Tensor:
  seed = tf.cast(seed, tf.int64)
  for d in data:
    seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(d, tf.int64))
  return seed


def _train_sources(data, workdir: Optional[str]) -> list[data_sources.Source]:
  if data.get("sources", ""):
    return data_sources.parse_sources(data.sources, "data.sources")
  if data.get("train_files", ""):
    return [data_sources.Source(data_sources.TEXT, data.train_files)]
  if not workdir:
    raise ValueError("No data.sources and no workdir to write the demo "
                     "corpus into.")
  train_glob, _ = demo_corpus.write_demo_corpus(workdir)
  return [data_sources.Source(data_sources.TEXT, train_glob)]


def _uses_demo(data) -> bool:
  return not (data.get("sources", "") or data.get("train_files", ""))


def _eval_sources(data, workdir) -> tuple[list[data_sources.Source], bool]:
  """(sources, held_out): held_out means 'the eval documents of train sources'."""
  if data.get("eval_sources", ""):
    return data_sources.parse_sources(data.eval_sources,
                                      "data.eval_sources"), False
  if data.get("eval_files", ""):
    return [data_sources.Source(data_sources.TEXT, data.eval_files)], False
  if _uses_demo(data):
    _, eval_path = demo_corpus.write_demo_corpus(workdir)
    return [data_sources.Source(data_sources.TEXT, eval_path)], False
  return _train_sources(data, workdir), True


def _train_holds_out(data) -> bool:
  return (not data.get("eval_sources", "") and not data.get("eval_files", "")
          and not _uses_demo(data) and data.get("eval_fraction", 0.0) > 0)


# -----------------------------------------------------------------------------
# Tokenizer and startup checks.
# -----------------------------------------------------------------------------


def tokenizer_cache_path(data, workdir: str) -> str:
  kind = data.tokenizer_type
  sources = ";".join(str(s) for s in _train_sources(data, workdir))
  if _uses_demo(data):
    sources = "demo"
  digest = hashlib.sha256(sources.encode()).hexdigest()[:8]
  case = "uncased" if data.lower_case else "cased"
  name = f"{kind}-{data.tokenizer_vocab_size}-{case}-{digest}"
  return os.path.join(workdir, "tokenizer", name,
                      tokenizers.default_filename(kind))


def training_sentences(data, workdir: Optional[str],
                       limit: Optional[int] = None) -> Iterator[str]:
  """Lines of the training sources for tokenizer training, weight-shared."""
  limit = limit or int(data.get("tokenizer_train_sentences", 2_000_000))
  sources = _train_sources(data, workdir)
  total = sum(s.weight for s in sources)
  for s in sources:
    yield from data_sources.python_lines(
        s, data.get("tfds_data_dir", ""), data.get("tfds_text_key", "text"),
        limit=max(1, int(limit * s.weight / total)))


def load_tokenizer(data: ml_collections.ConfigDict,
                   workdir: Optional[str]) -> tokenizers.Tokenizer:
  """The configured tokenizer; trains and caches one when none is given.

  With ``data.tokenizer_path`` empty, a ``data.tokenizer_type`` tokenizer of
  ``data.tokenizer_vocab_size`` is trained on the training sources and cached
  under ``workdir/tokenizer/<type>-<size>-<case>-<sources hash>/``. In a
  multi-process run only process 0 trains; the others wait for the file.
  """
  if data.tokenizer_type not in (tokenizers.SENTENCEPIECE, tokenizers.WORDPIECE):
    raise ValueError(f"data.tokenizer_type={data.tokenizer_type!r} must be "
                     f"'sentencepiece' or 'wordpiece'.")
  if data.tokenizer_path:
    return tokenizers.load(data.tokenizer_path, data.tokenizer_type,
                           data.lower_case)
  if not workdir:
    raise ValueError("data.tokenizer_path is empty and there is no workdir to "
                     "cache a trained tokenizer in.")
  if data.tokenizer_vocab_size < 16:
    raise ValueError(f"data.tokenizer_vocab_size={data.tokenizer_vocab_size} "
                     "is too small (need >= 16).")
  path = tokenizer_cache_path(data, workdir)
  if not tf.io.gfile.exists(path):
    if _process_index() == 0:
      logging.info("Training a %s tokenizer (vocab %d) into %s",
                   data.tokenizer_type, data.tokenizer_vocab_size, path)
      t0 = time.time()
      tokenizers.train(data.tokenizer_type, training_sentences(data, workdir),
                       data.tokenizer_vocab_size, data.lower_case, path)
      logging.info("Tokenizer trained in %.1fs.", time.time() - t0)
    else:
      deadline = time.time() + 3600
      while not tf.io.gfile.exists(path):
        if time.time() > deadline:
          raise ValueError(f"Timed out waiting for process 0 to write {path}.")
        time.sleep(2)
  return tokenizers.load(path, data.tokenizer_type, data.lower_case)


def _process_index() -> int:
  try:
    import jax  # pylint: disable=g-import-not-at-top
    return jax.process_index()
  except Exception:  # pylint: disable=broad-except
    return 0


# -----------------------------------------------------------------------------
# Example building (one vectorized map per block of lines).
# -----------------------------------------------------------------------------


def _first_true(x: tf.Tensor) -> tf.Tensor:
  """x[i] != x[i-1] (True at 0) for a 1-D tensor."""
  return tf.not_equal(x, tf.concat([[-1], x[:-1]], axis=0)[:tf.size(x)])


def _chain_starts(next_start: tf.Tensor, roots: tf.Tensor,
                  max_len: int) -> tf.Tensor:
  """Marks every node reachable from a root by following next_start.

  next_start[i] in (i, n] is where the chunk that starts at line i ends (the
  next chunk's first line; n = past the end). Pointer doubling: after k rounds
  the marks hold f^m(root) for all m < 2^k, so ceil(log2(max_len + 1)) + 1
  rounds cover every chain in a block of max_len lines. Vectorized
  equivalent of the sequential greedy loop in create_pretraining_data.py.
  """
  n = tf.size(next_start)
  f = tf.concat([next_start, [n]], axis=0)  # sentinel n -> n
  marks = tf.concat([tf.cast(roots, tf.int32), [0]], axis=0)
  for _ in range(int(np.ceil(np.log2(max_len + 1))) + 1):
    hit = tf.math.unsorted_segment_max(marks, f, n + 1)
    marks = tf.maximum(marks, tf.maximum(hit, 0))
    f = tf.gather(f, f)
  return tf.cast(marks[:n], tf.bool)


class ExampleBuilder:
  """Block of raw lines [L] + seed -> dict of examples [C, ...] (see module doc)."""

  def __init__(self, tok: tokenizers.Tokenizer, data, mode: str = "all",
               eval_fraction: float = 0.0):
    self.tok = tok
    self.t = int(data.seq_length)
    self.objective = objective(data)
    self.short_seq_prob = float(data.short_seq_prob)
    self.max_line_bytes = int(data.max_line_bytes)
    self.mode = mode  # "all", "train" (drop held-out docs), "eval" (keep them)
    self.eval_fraction = float(eval_fraction)
    self.cls, self.sep, self.pad = tok.cls_id, tok.sep_id, tok.pad_id
    self.block_lines = int(data.block_lines)

  def __call__(self, raw: tf.Tensor, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    t = self.t
    max_tok = t - 3
    seeds = tf.random.experimental.stateless_split(seed, num=8)

    # --- Clean and tokenize lines.
    line = tf.strings.substr(raw, 0, self.max_line_bytes)
    long_line = tf.strings.length(raw) > self.max_line_bytes
    fixed = tf.strings.unicode_transcode(line, "UTF-8", "UTF-8",
                                         errors="replace")
    invalid = tf.not_equal(fixed, line)
    text = tf.strings.strip(fixed)
    boundary = tf.equal(text, "")
    blank = boundary & (tf.strings.length(raw) > 0)
    toks = self.tok.tokenize(text).with_row_splits_dtype(tf.int64)
    lens = tf.cast(toks.row_lengths(), tf.int32)
    long_sent = lens > max_tok
    toks = toks[:, :max_tok]
    lens = tf.minimum(lens, max_tok)
    doc = tf.cumsum(tf.cast(boundary, tf.int32))  # document number per line
    keep = ~boundary & (lens > 0)

    # --- Hold out documents (by a hash of their first line in the block).
    if self.mode in ("train", "eval") and self.eval_fraction > 0:
      h = tf.strings.to_hash_bucket_fast(text, 1_000_000)
      kd = tf.boolean_mask(doc, keep)
      kh = tf.boolean_mask(h, keep)
      first = _first_true(kd)
      didx = tf.cumsum(tf.cast(first, tf.int32)) - 1
      is_eval = tf.boolean_mask(kh, first) < int(self.eval_fraction * 1e6)
      line_eval = tf.gather(is_eval, didx)
      sel = line_eval if self.mode == "eval" else ~line_eval
      idx = tf.boolean_mask(tf.range(tf.size(raw)), keep)
      keep = tf.cast(tf.scatter_nd(idx[:, None], tf.cast(sel, tf.int32),
                                   tf.shape(keep)), tf.bool)

    kt = tf.ragged.boolean_mask(toks, keep)
    kln = tf.boolean_mask(lens, keep)
    kdoc = tf.boolean_mask(doc, keep)
    n = tf.size(kln)
    ndocs = tf.reduce_sum(tf.cast(_first_true(kdoc), tf.int32))

    if self.objective == PACKED:
      out = self._packed(kt, kln, kdoc, doc[-1])
    else:
      out = self._pairs(kt, kln, kdoc, n, seeds)

    c = tf.shape(out["input_ids"])[0]
    stats = tf.stack([
        tf.size(raw), tf.reduce_sum(tf.cast(invalid, tf.int32)),
        tf.reduce_sum(tf.cast(long_line, tf.int32)),
        tf.reduce_sum(tf.cast(long_sent & keep, tf.int32)),
        tf.reduce_sum(tf.cast(blank, tf.int32)), ndocs, c])
    # The block's counts ride on its first example (summed downstream).
    first_row = tf.cast(tf.equal(tf.range(c), 0), tf.int32)[:, None]
    out[_STATS_KEY] = first_row * stats[None, :]
    return out

  def _assemble(self, flat, a_start, na, b_start, nb, labels,
                final_sep=None) -> dict[str, tf.Tensor]:
    """Dense [CLS] A [SEP] B [SEP] (or [CLS] A [+SEP] when nb is None).

    flat: int32 token array; A = flat[a_start:a_start+na], same for B.
    """
    t = self.t
    p = tf.range(t)[None, :]
    na_ = na[:, None]
    in_a = (p >= 1) & (p <= na_)
    if nb is None:  # packed: [CLS] body [SEP]? ; no segment B
      add = tf.cast(final_sep, tf.int32)[:, None]
      in_b = tf.zeros_like(in_a)
      seps = (p == na_ + 1) & (add > 0)
      length = na_ + 1 + add
      idx = tf.where(in_a, a_start[:, None] + p - 1, 0)
    else:
      nb_ = nb[:, None]
      in_b = (p >= na_ + 2) & (p <= na_ + nb_ + 1)
      last_sep = p == na_ + nb_ + 2
      seps = (p == na_ + 1) | last_sep
      length = na_ + nb_ + 3
      idx = tf.where(in_a, a_start[:, None] + p - 1,
                     tf.where(in_b, b_start[:, None] + p - na_ - 2, 0))
    vals = tf.gather(tf.concat([flat, [0]], axis=0), idx)
    ids = tf.where(in_a | in_b, vals,
                   tf.where(seps, self.sep, tf.where(p == 0, self.cls, self.pad)))
    real = p < length
    segment = (in_b | (seps & (p > na_ + 1))) if nb is not None else in_b
    return dict(
        input_ids=tf.ensure_shape(ids, [None, t]),
        input_mask=tf.ensure_shape(tf.cast(real, tf.int32), [None, t]),
        segment_ids=tf.ensure_shape(tf.cast(segment, tf.int32), [None, t]),
        next_sentence_labels=tf.cast(labels, tf.int32),
    )

  def _pairs(self, kt, kln, kdoc, n, seeds) -> dict[str, tf.Tensor]:
    max_tok = self.t - 3
    flat = kt.flat_values
    line_start = tf.cast(kt.row_starts(), tf.int32)

    # Chunk sentences per document as BERT does: from a chunk's first line i,
    # add lines until the chunk reaches targets[i] tokens or the document ends.
    short = tf.random.stateless_uniform([n], seeds[0]) < self.short_seq_prob
    short_len = tf.random.stateless_uniform(
        [n], seeds[1], minval=2, maxval=max_tok + 1, dtype=tf.int32)
    targets = tf.where(short, short_len, max_tok)
    new_doc = _first_true(kdoc)
    line_ids = tf.range(n)
    didx = tf.cumsum(tf.cast(new_doc, tf.int32)) - 1
    doc_last = tf.gather(tf.math.unsorted_segment_max(line_ids, didx, n), didx)
    cum = tf.cumsum(kln)
    close = tf.searchsorted(cum, cum - kln + targets, side="left",
                            out_type=tf.int32)
    next_start = tf.minimum(close, doc_last) + 1
    starts = _chain_starts(next_start, new_doc, self.block_lines)
    cid = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    c = tf.reduce_sum(tf.cast(starts, tf.int32))
    first_line = tf.math.unsorted_segment_min(line_ids, cid, c)
    nsent = tf.math.unsorted_segment_sum(tf.ones_like(line_ids), cid, c)
    last_line = first_line + nsent - 1
    cstart = tf.gather(line_start, first_line)
    cend = tf.gather(line_start, last_line) + tf.gather(kln, last_line)
    clen = cend - cstart
    cdoc = tf.gather(kdoc, first_line)
    ctarget = tf.gather(targets, first_line)

    # Split point: a sentence boundary, or inside a lone sentence.
    u = tf.random.stateless_uniform([c], seeds[2])
    a_end = 1 + tf.cast(u * tf.cast(nsent - 1, tf.float32), tf.int32)
    sp_sent = tf.gather(line_start, tf.minimum(first_line + a_end, n - 1))
    sp_tok = cstart + 1 + tf.cast(u * tf.cast(clen - 1, tf.float32), tf.int32)
    sp = tf.where(nsent >= 2, sp_sent, tf.minimum(sp_tok, cend - 1))
    valid = clen >= 2
    a_start, a_stop, b_start, b_stop = cstart, sp, sp, cend
    coin = tf.random.stateless_uniform([c], seeds[3]) < 0.5

    if self.objective == NSP:
      k = 8
      cand = tf.random.stateless_uniform(
          [c, k], seeds[4], minval=0, maxval=tf.maximum(c, 1), dtype=tf.int32)
      # Prefer another document; in a block holding a single long document
      # (a book) fall back to a chunk of it at least 3 chunks away.
      other = tf.not_equal(tf.gather(cdoc, cand), cdoc[:, None])
      far = tf.abs(cand - tf.range(c)[:, None]) >= 3
      rank = 2 * tf.cast(other, tf.int32) + tf.cast(far, tf.int32)
      has = tf.reduce_any(other | far, axis=1)
      pick = tf.gather(cand, tf.argmax(rank, axis=1, output_type=tf.int32),
                       batch_dims=1)
      is_random = coin & has
      want_b = tf.maximum(1, ctarget - (a_stop - a_start))
      rb_start = tf.gather(cstart, pick)
      rb_stop = tf.minimum(tf.gather(cend, pick), rb_start + want_b)
      b_start = tf.where(is_random, rb_start, b_start)
      b_stop = tf.where(is_random, rb_stop, b_stop)
      labels = tf.cast(is_random, tf.int32)
    else:  # SOP: swap the two segments.
      a_start, b_start = (tf.where(coin, b_start, a_start),
                          tf.where(coin, a_start, b_start))
      a_stop, b_stop = (tf.where(coin, b_stop, a_stop),
                        tf.where(coin, a_stop, b_stop))
      labels = tf.cast(coin, tf.int32)

    # Truncate the pair to max_tok: trim the longer side (ties: B) first.
    la, lb = a_stop - a_start, b_stop - b_start
    half_b = max_tok // 2
    half_a = max_tok - half_b
    over = la + lb > max_tok
    na = tf.where(la <= lb, tf.minimum(la, half_a), max_tok - tf.minimum(lb, half_b))
    nb = max_tok - na
    na = tf.where(over, na, la)
    nb = tf.where(over, nb, lb)
    front_a = tf.random.stateless_binomial(
        [c], seeds[5], counts=tf.cast(la - na, tf.float32), probs=0.5)
    front_b = tf.random.stateless_binomial(
        [c], seeds[6], counts=tf.cast(lb - nb, tf.float32), probs=0.5)
    a_start += front_a
    b_start += front_b

    sel = tf.where(valid)[:, 0]
    a_start, na, b_start, nb, labels = (
        tf.gather(x, sel) for x in (a_start, na, b_start, nb, labels))
    return self._assemble(flat, a_start, na, b_start, nb, labels)

  def _packed(self, kt, kln, kdoc, last_doc) -> dict[str, tf.Tensor]:
    cap = self.t - 2  # room for [CLS] and a final [SEP]
    n = tf.size(kln)
    next_doc = tf.concat([kdoc[1:], [last_doc]], axis=0)[:n]
    doc_end = tf.cast(tf.not_equal(next_doc, kdoc), tf.int32)  # [SEP] after
    # Token stream with a [SEP] after each document's last line.
    flat = kt.flat_values
    seps_before = tf.cumsum(doc_end, exclusive=True)
    line_start = tf.cast(kt.row_starts(), tf.int32) + seps_before
    tok_line = tf.cast(kt.value_rowids(), tf.int32)
    tok_pos = tf.range(tf.size(flat)) + tf.gather(seps_before, tok_line)
    sep_pos = tf.boolean_mask(line_start + kln, doc_end > 0)
    total = tf.size(flat) + tf.size(sep_pos)
    stream = tf.scatter_nd(
        tf.concat([tok_pos, sep_pos], axis=0)[:, None],
        tf.concat([flat, tf.fill(tf.shape(sep_pos), self.sep)], axis=0),
        total[None])
    l2 = kln + doc_end
    # Greedy: a line starts a new sequence when it does not fit in the current.
    cum = tf.cumsum(l2)
    next_start = tf.searchsorted(cum, cum - l2 + cap, side="right",
                                 out_type=tf.int32)
    starts = _chain_starts(next_start, tf.equal(tf.range(n), 0),
                           self.block_lines)
    bins = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    nb = tf.reduce_sum(tf.cast(starts, tf.int32))
    line_ids = tf.range(n)
    first = tf.math.unsorted_segment_min(line_ids, bins, nb)
    last = tf.math.unsorted_segment_max(line_ids, bins, nb)
    b_start = tf.gather(line_start, first)
    b_len = tf.gather(line_start, last) + tf.gather(l2, last) - b_start
    ends_sep = tf.gather(doc_end, last) > 0
    return self._assemble(stream, b_start, b_len, None, None,
                          tf.zeros([nb], tf.int32), final_sep=~ends_sep)


# -----------------------------------------------------------------------------
# Datasets.
# -----------------------------------------------------------------------------


def _source_examples(source: data_sources.Source, builder: ExampleBuilder,
                     data, seed: np.ndarray, process_index: int,
                     process_count: int, epochs: Optional[int]
                     ) -> tf.data.Dataset:
  """Examples of one source for this process; `epochs=None` repeats forever."""
  block_lines = int(data.block_lines)

  def blocks_to_examples(lines: tf.data.Dataset, key, epoch) -> tf.data.Dataset:
    blocks = lines.batch(block_lines).enumerate()
    return blocks.map(
        _nc(lambda i, b: builder(b, _fold(seed, key, epoch, i))),
        num_parallel_calls=AUTOTUNE, deterministic=True).unbatch()

  if source.kind == data_sources.TFDS:
    docs = data_sources.tfds_documents(
        source, data.get("tfds_data_dir", ""), data.get("tfds_text_key", "text"),
        process_index, process_count)
    lines = docs.map(_nc(data_sources.document_to_lines)).unbatch()
    lines = lines.repeat(epochs)
    key = data_sources.file_key(source.spec + ":" + source.split)
    return blocks_to_examples(lines, key, 0)

  files, _ = data_sources.resolve_text_files(source)
  by_file = len(files) >= process_count
  if by_file:
    files = files[process_index::process_count]
  keys = [data_sources.file_key(f) for f in files]
  files_t = tf.constant(files)
  keys_t = tf.constant(keys, tf.int64)
  file_seed = tf.constant(seed)
  cycle = max(1, min(int(data.get("cycle_length", 8)), len(files)))

  def one_file(path, key, epoch):
    lines = tf.data.TextLineDataset(path).concatenate(
        tf.data.Dataset.from_tensors(tf.constant("")))
    return blocks_to_examples(lines, key, epoch)

  def one_epoch(epoch):
    perm = tf.random.experimental.stateless_shuffle(
        tf.range(len(files)), _fold(file_seed, 7, epoch))
    ds = tf.data.Dataset.from_tensor_slices(
        (tf.gather(files_t, perm), tf.gather(keys_t, perm)))
    ds = ds.interleave(_nc(lambda f, k: one_file(f, k, epoch)),
                       cycle_length=cycle,
                       block_length=1, num_parallel_calls=AUTOTUNE,
                       deterministic=True)
    if not by_file and process_count > 1:
      ds = ds.shard(process_count, process_index)
    return ds

  return tf.data.Dataset.range(epochs or _MAX_EPOCHS).flat_map(_nc(one_epoch))


def _examples(config, tok, workdir, process_index, process_count, mode: str,
              epochs: Optional[int]) -> tf.data.Dataset:
  data = config.data
  if mode == "eval":
    sources, held_out = _eval_sources(data, workdir)
    bmode = "eval" if held_out else "all"
  else:
    sources = _train_sources(data, workdir)
    bmode = "train" if _train_holds_out(data) else "all"
  builder = _builder_fn(tok, data, bmode, data.get("eval_fraction", 0.0))
  dsets = [
      _source_examples(s, builder, data, _seed(config, mode, "source", i),
                       process_index, process_count, epochs)
      for i, s in enumerate(sources)]
  if len(dsets) == 1:
    return dsets[0]
  weights = np.array([s.weight for s in sources], np.float64)
  return tf.data.Dataset.sample_from_datasets(
      dsets, weights=(weights / weights.sum()).tolist(),
      seed=int(_seed(config, mode, "mix")[0]),
      stop_on_empty_dataset=epochs is not None)


def _cached(tok, key, make):
  """Per-tokenizer cache of traced tf.functions (tracing costs seconds)."""
  cache = tok.__dict__.setdefault("_fn_cache", {})
  if key not in cache:
    cache[key] = make()
  return cache[key]


def _builder_fn(tok, data, mode: str, eval_fraction: float):
  """ExampleBuilder as a tf.function traced once and shared by pipelines."""
  key = ("builder", int(data.seq_length), objective(data),
         float(data.short_seq_prob), int(data.max_line_bytes),
         int(data.block_lines), mode, float(eval_fraction))

  def make():
    builder = ExampleBuilder(tok, data, mode, eval_fraction)
    return tf.function(builder, autograph=False, input_signature=[
        tf.TensorSpec([None], tf.string), tf.TensorSpec([2], tf.int64)])
  return _cached(tok, key, make)


def _masker_fn(data, tok):
  key = ("masker", int(data.max_predictions_per_seq), float(data.mask_rate),
         float(data.mask_token_prob), float(data.random_token_prob),
         bool(data.whole_word_mask), int(data.seq_length),
         int(data.max_ngram))

  def make():
    masker = make_masker(data, tok)
    return tf.function(masker, autograph=False, input_signature=[
        tf.TensorSpec([None, int(data.seq_length)], tf.int32),
        tf.TensorSpec([2], tf.int64)])
  return _cached(tok, key, make)


def make_masker(data, tok) -> masking.Masker:
  return masking.Masker(
      vocab_size=tok.vocab_size, special_ids=tok.special_ids,
      mask_id=tok.mask_id, max_predictions=data.max_predictions_per_seq,
      mask_rate=data.mask_rate, mask_token_prob=data.mask_token_prob,
      random_token_prob=data.random_token_prob,
      whole_word=data.whole_word_mask,
      word_start=tok.word_start if data.whole_word_mask else None,
      max_ngram=data.max_ngram)


def per_host_batch_size(config, process_count: int) -> int:
  b = int(config.train.batch_size)
  if b % process_count:
    raise ValueError(f"train.batch_size={b} is not divisible by the process "
                     f"count {process_count}.")
  return b // process_count


def make_dataset(config, tok, workdir, *, process_index: int = 0,
                 process_count: int = 1, mode: str = "train",
                 epochs: Optional[int] = None, batch_size: Optional[int] = None,
                 shuffle: Optional[bool] = None, keep_stats: bool = True
                 ) -> tf.data.Dataset:
  """The batched, masked tf.data pipeline (mode 'train' or 'eval')."""
  data = config.data
  bsz = batch_size or per_host_batch_size(config, process_count)
  ds = _examples(config, tok, workdir, process_index, process_count, mode,
                 epochs)
  if shuffle is None:
    shuffle = mode == "train"
  if shuffle and data.shuffle_buffer > 0:
    ds = ds.shuffle(int(data.shuffle_buffer),
                    seed=int(_seed(config, mode, "shuffle", process_index)[0]),
                    reshuffle_each_iteration=True)
  ds = ds.batch(bsz, drop_remainder=True).enumerate()
  masker = _masker_fn(data, tok)
  mask_seed = tf.constant(_seed(config, mode, "mask", process_index))

  def finish(i, ex):
    out = masker(ex["input_ids"], _fold(mask_seed, i))
    out["input_mask"] = ex["input_mask"]
    out["segment_ids"] = ex["segment_ids"]
    out["next_sentence_labels"] = ex["next_sentence_labels"]
    out = {k: out[k] for k in FEATURES}
    if keep_stats:
      out[_STATS_KEY] = tf.reduce_sum(ex[_STATS_KEY], axis=0)
    return out

  ds = ds.map(_nc(finish), num_parallel_calls=AUTOTUNE, deterministic=True)
  options = tf.data.Options()
  options.deterministic = True
  options.experimental_optimization.map_parallelization = False
  ds = ds.with_options(options)
  return ds.prefetch(2)


def _looks_nonempty(sources, tok, process_index, process_count) -> bool:
  """Cheap check: this process's first text lines hold enough tokens."""
  if any(src.kind != data_sources.TEXT for src in sources):
    return False
  lines = []
  for src in sources:
    files, _ = data_sources.resolve_text_files(src)
    if len(files) >= process_count:
      files = files[process_index::process_count]
    for path in files:
      with tf.io.gfile.GFile(path, "rb") as f:
        for raw in f:
          line = raw[:4096].decode("utf-8", errors="replace").strip()
          if line:
            lines.append(line)
          if len(lines) >= 256:
            break
      if len(lines) >= 256:
        break
  if not lines:
    return False
  n_tokens = int(tf.size(tok.tokenize(tf.constant(lines)).flat_values))
  return n_tokens >= 64 * process_count


def _check_nonempty(config, tok, workdir, process_index, process_count, mode):
  """Raises ValueError if the data yields no example (instead of hanging)."""
  data = config.data
  if mode == "train":
    sources = _train_sources(data, workdir)
    quick = not _train_holds_out(data)
  else:
    sources, held_out = _eval_sources(data, workdir)
    quick = not held_out
  if quick and _looks_nonempty(sources, tok, process_index, process_count):
    return
  probe = _examples(config, tok, workdir, process_index, process_count, mode,
                    epochs=1).take(1)
  for _ in probe:
    return
  src = (data.sources or data.train_files or "demo corpus"
         ) if mode == "train" else (data.eval_sources or data.eval_files or
                                    "held-out documents")
  raise ValueError(
      f"The {mode} data ({src}) produced no examples for process "
      f"{process_index}/{process_count}: every document is empty, "
      "whitespace-only, held out or shorter than 2 tokens.")


class DataIterator:
  """Iterator of per-host numpy batches whose exact state can be saved."""

  def __init__(self, ds: tf.data.Dataset, process_index: int = 0):
    self._ds = ds
    self._it = iter(ds)
    self._ckpt = tf.train.Checkpoint(iterator=self._it)
    self.process_index = process_index
    self.stats = {k: 0 for k in STATS}
    self._batches = 0
    self._logged_bad = 0

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = next(self._it)
    out = {k: v.numpy() for k, v in batch.items()}
    st = out.pop(_STATS_KEY, None)
    self._batches += 1
    if st is not None:
      for k, v in zip(STATS, st.tolist()):
        self.stats[k] += int(v)
      bad = sum(self.stats[k] for k in STATS[1:5])
      if self._batches == 1 or (bad > self._logged_bad and
                                self._batches % 1000 == 0):
        self._logged_bad = bad
        logging.info("Data (process %d) so far: %s", self.process_index,
                     ", ".join(f"{k}={v}" for k, v in self.stats.items()))
    return out

  def _path(self, directory: str) -> str:
    return os.path.join(directory, f"process_{self.process_index}")

  def save(self, directory: str) -> str:
    """Writes the iterator state under directory/process_<i>/."""
    d = self._path(directory)
    tf.io.gfile.makedirs(d)
    path = self._ckpt.write(os.path.join(d, "iterator"))
    with tf.io.gfile.GFile(os.path.join(d, "stats.json"), "w") as f:
      json.dump(dict(self.stats, batches=self._batches), f)
    return path

  def restore(self, directory: str) -> None:
    d = self._path(directory)
    prefix = os.path.join(d, "iterator")
    if not tf.io.gfile.glob(prefix + "*"):
      raise ValueError(f"No data iterator state at {prefix}.")
    self._ckpt.read(prefix).assert_consumed()
    stats_path = os.path.join(d, "stats.json")
    if tf.io.gfile.exists(stats_path):
      with tf.io.gfile.GFile(stats_path) as f:
        saved = json.load(f)
      self._batches = saved.pop("batches", 0)
      self.stats.update({k: v for k, v in saved.items() if k in self.stats})


def create_train_iterator(config, tok, workdir, process_index: int = 0,
                          process_count: int = 1) -> DataIterator:
  """Endless iterator of per-host training batches (dicts of numpy arrays)."""
  _check_nonempty(config, tok, workdir, process_index, process_count, "train")
  ds = make_dataset(config, tok, workdir, process_index=process_index,
                    process_count=process_count, mode="train")
  return DataIterator(ds, process_index)


_EVAL_CACHE: dict[str, list[dict[str, np.ndarray]]] = {}


def create_eval_batches(config, tok, workdir, process_index: int = 0,
                        process_count: int = 1) -> list[dict[str, np.ndarray]]:
  """data.num_eval_batches held-out batches, identical on every call."""
  key = json.dumps([config.data.to_dict(), config.train.batch_size,
                    config.train.seed, workdir, tok.path, process_index,
                    process_count], sort_keys=True, default=str)
  if key not in _EVAL_CACHE:
    _check_nonempty(config, tok, workdir, process_index, process_count, "eval")
    ds = make_dataset(config, tok, workdir, process_index=process_index,
                      process_count=process_count, mode="eval",
                      keep_stats=False)
    batches = [{k: v.numpy() for k, v in b.items()}
               for b in ds.take(int(config.data.num_eval_batches))]
    _EVAL_CACHE[key] = batches
  return [dict(b) for b in _EVAL_CACHE[key]]
