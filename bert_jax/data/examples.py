"""Example building: a block of raw text lines -> BERT pretraining examples.

One vectorized TF function per block of ``data.block_lines`` consecutive lines
of one file (``ExampleBuilder``): clean lines (invalid UTF-8 replaced, long
lines cut), tokenize (SentencePiece / WordPiece), optionally drop or keep the
held-out documents, then build NSP / SOP pairs or RoBERTa-style packed
sequences. Masking happens later, per batch (``masking``).

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

With ``data.packing`` the examples are later packed several to a row
(``packing``); pairs are built as above, and the RoBERTa-style objective
builds document chunks instead of one stream across documents: consecutive
lines of ONE document while they fit, ``[CLS] chunk [SEP]``, so that no
example (and, once packed, no attention) crosses a document.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import tokenizers

NSP, SOP, PACKED = config_lib.NSP, config_lib.SOP, config_lib.PACKED
# Per-block counters carried alongside examples under STATS_KEY: a [C, 7]
# int32 tensor whose rows sum to the block's counts (the iterator sums).
STATS = ("lines", "invalid_utf8_lines", "long_lines", "long_sentences",
         "blank_lines", "documents", "examples")
STATS_KEY = "_stats"
# Hold-out modes: "all" documents, "train" (drop held-out), "eval" (keep them).
MODES = ("all", "train", "eval")
# A line's hold-out hash is in [0, HASH_BUCKETS): a document is held out
# when its first line's is below eval_fraction * HASH_BUCKETS.
HASH_BUCKETS = 1_000_000


objective = config_lib.sentence_objective


@dataclasses.dataclass(frozen=True)
class ExampleOptions:
  """Everything an ExampleBuilder reads from the config (hashable: it keys
  the cache of traced builders in data/pipeline.py)."""
  seq_length: int
  objective: str
  short_seq_prob: float
  max_line_bytes: int
  block_lines: int
  mode: str = "all"
  eval_fraction: float = 0.0
  packing: bool = False

  @classmethod
  def from_config(cls, data: ml_collections.ConfigDict, mode: str = "all",
                  eval_fraction: float = 0.0) -> "ExampleOptions":
    if mode not in MODES:
      raise ValueError(f"mode={mode!r} must be one of {MODES}.")
    return cls(seq_length=int(data.seq_length), objective=objective(data),
               short_seq_prob=float(data.short_seq_prob),
               max_line_bytes=int(data.max_line_bytes),
               block_lines=int(data.block_lines), mode=mode,
               eval_fraction=float(eval_fraction),
               packing=bool(data.get("packing", False)))


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

  def __init__(self, tok: tokenizers.Tokenizer, options: ExampleOptions):
    self.tok = tok
    self.t = options.seq_length
    self.objective = options.objective
    self.short_seq_prob = options.short_seq_prob
    self.max_line_bytes = options.max_line_bytes
    self.mode = options.mode
    self.eval_fraction = options.eval_fraction
    self.cls, self.sep, self.pad = tok.cls_id, tok.sep_id, tok.pad_id
    self.block_lines = options.block_lines
    self.packing = options.packing

  def __call__(self, raw: tf.Tensor, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    return self.from_tokens(**self.tokenize_block(raw), seed=seed)

  def tokenize_block(self, raw: tf.Tensor) -> dict[str, tf.Tensor]:
    """Block of raw lines [L] -> what example building reads of it: the
    kept lines' token ids (ragged, not yet cut to the row), their hold-out
    hashes and document numbers, the block's last document number and its
    line counters (lines, invalid UTF-8, cut, blank). What pre-tokenized
    shards store per block (``shard_format``)."""
    line = tf.strings.substr(raw, 0, self.max_line_bytes)
    long_line = tf.strings.length(raw) > self.max_line_bytes
    fixed = tf.strings.unicode_transcode(line, "UTF-8", "UTF-8",
                                         errors="replace")
    invalid = tf.not_equal(fixed, line)
    text = tf.strings.strip(fixed)
    boundary = tf.equal(text, "")
    blank = boundary & (tf.strings.length(raw) > 0)
    toks = self.tok.tokenize(text).with_row_splits_dtype(tf.int64)
    doc = tf.cumsum(tf.cast(boundary, tf.int32))  # document number per line
    keep = ~boundary & (toks.row_lengths() > 0)
    count = lambda x: tf.reduce_sum(tf.cast(x, tf.int32))
    return dict(
        tokens=tf.ragged.boolean_mask(toks, keep),
        hashes=tf.boolean_mask(
            tf.strings.to_hash_bucket_fast(text, HASH_BUCKETS), keep),
        docs=tf.boolean_mask(doc, keep), last_doc=doc[-1],
        line_stats=tf.stack([tf.size(raw), count(invalid), count(long_line),
                             count(blank)]))

  def from_tokens(self, tokens, hashes, docs, last_doc, line_stats,
                  seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """Examples [C, ...] from a block's kept lines (``tokenize_block``)."""
    t = self.t
    max_tok = t - 3
    seeds = tf.random.experimental.stateless_split(seed, num=8)
    lens = tf.cast(tokens.row_lengths(), tf.int32)
    long_sent = lens > max_tok
    kt = tokens[:, :max_tok]
    kln = tf.minimum(lens, max_tok)
    kdoc = docs
    keep = tf.ones_like(long_sent)

    # --- Hold out documents (by a hash of their first line in the block).
    if self.mode in ("train", "eval") and self.eval_fraction > 0:
      first = _first_true(kdoc)
      didx = tf.cumsum(tf.cast(first, tf.int32)) - 1
      is_eval = tf.boolean_mask(hashes, first) < int(
          self.eval_fraction * HASH_BUCKETS)
      line_eval = tf.gather(is_eval, didx)
      keep = line_eval if self.mode == "eval" else ~line_eval
      kt = tf.ragged.boolean_mask(kt, keep)
      kln = tf.boolean_mask(kln, keep)
      kdoc = tf.boolean_mask(kdoc, keep)

    n = tf.size(kln)
    ndocs = tf.reduce_sum(tf.cast(_first_true(kdoc), tf.int32))

    if self.objective == PACKED and self.packing:
      out = self._document_chunks(kt, kln, kdoc)
    elif self.objective == PACKED:
      out = self._packed(kt, kln, kdoc, last_doc)
    else:
      out = self._pairs(kt, kln, kdoc, n, seeds)

    c = tf.shape(out["input_ids"])[0]
    ls = tf.cast(line_stats, tf.int32)
    stats = tf.stack([
        ls[0], ls[1], ls[2],
        tf.reduce_sum(tf.cast(long_sent & keep, tf.int32)), ls[3], ndocs, c])
    # The block's counts ride on its examples, shared out evenly (row i gets
    # s // c, plus 1 for i < s % c): they sum to the block's counts, and any
    # batch, the first one too, carries its share of the lines behind it.
    # A block with no example carries none (a source of such blocks is
    # stopped at startup by data_sources.check_usable).
    cc = tf.maximum(c, 1)
    row = tf.range(c)[:, None]
    out[STATS_KEY] = (stats[None, :] // cc +
                      tf.cast(row < (stats % cc)[None, :], tf.int32))
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

  def _document_chunks(self, kt, kln, kdoc) -> dict[str, tf.Tensor]:
    """[CLS] lines of one document [SEP], greedily as long as they fit
    (every line fits: lines are cut to seq_length - 3 tokens)."""
    cap = self.t - 2
    n = tf.size(kln)
    line_ids = tf.range(n)
    new_doc = _first_true(kdoc)
    didx = tf.cumsum(tf.cast(new_doc, tf.int32)) - 1
    doc_last = tf.gather(tf.math.unsorted_segment_max(line_ids, didx, n), didx)
    cum = tf.cumsum(kln)
    fit = tf.searchsorted(cum, cum - kln + cap, side="right",
                          out_type=tf.int32)
    next_start = tf.minimum(fit, doc_last + 1)
    starts = _chain_starts(next_start, new_doc, self.block_lines)
    chunk = tf.cumsum(tf.cast(starts, tf.int32)) - 1
    c = tf.reduce_sum(tf.cast(starts, tf.int32))
    first = tf.math.unsorted_segment_min(line_ids, chunk, c)
    last = tf.math.unsorted_segment_max(line_ids, chunk, c)
    line_start = tf.cast(kt.row_starts(), tf.int32)
    start = tf.gather(line_start, first)
    length = tf.gather(line_start, last) + tf.gather(kln, last) - start
    return self._assemble(kt.flat_values, start, length, None, None,
                          tf.zeros([c], tf.int32),
                          final_sep=tf.ones([c], tf.bool))
