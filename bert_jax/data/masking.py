"""Masked-LM masking inside the tf.data graph, with stateless random ops.

Selection rule (as google-research/bert's create_pretraining_data.py): each row
gets exactly ``n = min(P, max(1, round(mask_rate * n_selectable)))`` predicted
tokens, where ``n_selectable`` counts the row's tokens that are not special
([CLS], [SEP], [PAD], [MASK], [UNK], [unused*]) and ``P`` is
``max_predictions_per_seq``. Rows with no selectable token get none.

Whole-word option: a word is a word-start piece plus the continuation pieces
after it ("##x" in WordPiece, pieces that do not start with "\u2581" in
SentencePiece). Words are visited in random order and taken while the running
token count stays <= n (so a row may get slightly fewer than n tokens when a
word does not fit); all pieces of a word share the selection and the same
80/10/10 outcome.

N-gram option (ALBERT, ``max_ngram`` > 1): units (whole words with the
whole-word option, else tokens) are cut into consecutive spans of n units,
n drawn with p(n) proportional to 1/n for n = 1..max_ngram (spans also end
at special tokens); spans are visited in random order and taken while the
token count stays <= n (three passes, each over the spans that still fit,
so short spans fill what long ones leave). A span shares one 80/10/10 draw.
Unlike ALBERT's create_pretraining_data.py the spans are cut before they
are chosen (no rejected overlaps), which keeps the op vectorized and
stateless; the span-length distribution and the masked share are the same
in expectation up to the budget's end effects.

Of the selected tokens, ``mask_token_prob`` become [MASK], ``random_token_prob``
a token drawn uniformly from the non-special vocabulary, the rest stay as they
are. Positions come out sorted ascending, padded to P with position 0, id 0 and
weight 0.

All randomness comes from ``tf.random.stateless_*`` keyed by a seed tensor the
caller derives from (data seed, batch index), so the tf.data iterator that runs
this can be checkpointed and every epoch gets a new mask (dynamic masking).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf


class Masker:
  """Callable: (input_ids [B, T] int32, seed [2] int) -> masked features."""

  def __init__(self, *, vocab_size: int, special_ids: Sequence[int],
               mask_id: int, max_predictions: int, mask_rate: float = 0.15,
               mask_token_prob: float = 0.8, random_token_prob: float = 0.1,
               whole_word: bool = False, word_start: np.ndarray | None = None,
               max_ngram: int = 1):
    if whole_word and word_start is None:
      raise ValueError("whole_word masking needs a word_start table.")
    if max_ngram < 1:
      raise ValueError(f"data.max_ngram={max_ngram} must be >= 1 (1: no "
                       "n-gram spans).")
    self.max_ngram = int(max_ngram)
    selectable = np.ones([vocab_size], bool)
    selectable[[i for i in special_ids if 0 <= i < vocab_size]] = False
    self.selectable = selectable
    self.random_pool = np.flatnonzero(selectable).astype(np.int32)
    self.word_start = (None if word_start is None else
                       np.asarray(word_start, bool)[:vocab_size])
    self.vocab_size = vocab_size
    self.mask_id = int(mask_id)
    self.max_predictions = int(max_predictions)
    self.mask_rate = float(mask_rate)
    self.mask_token_prob = float(mask_token_prob)
    self.random_token_prob = float(random_token_prob)
    self.whole_word = bool(whole_word)

  def __call__(self, input_ids: tf.Tensor, seed: tf.Tensor) -> dict[str, tf.Tensor]:
    """Returns input_ids (masked), masked_lm_positions/ids/weights."""
    ids = tf.convert_to_tensor(input_ids, tf.int32)
    shape = tf.shape(ids)
    t = shape[1]
    p = self.max_predictions
    seeds = tf.random.experimental.stateless_split(
        tf.cast(seed, tf.int64), num=4)

    ok = tf.gather(tf.constant(self.selectable), ids)  # [B, T] bool
    n_ok = tf.reduce_sum(tf.cast(ok, tf.int32), axis=1)
    n_sel = tf.cast(tf.round(self.mask_rate * tf.cast(n_ok, tf.float32)),
                    tf.int32)
    n_sel = tf.minimum(p, tf.maximum(1, n_sel))
    n_sel = tf.where(n_ok > 0, n_sel, 0)  # [B]

    if self.max_ngram > 1:
      selected, word_id = self._select_spans(ids, ok, n_sel, seeds[0],
                                             seeds[3])
    elif self.whole_word:
      selected, word_id = self._select_words(ids, ok, n_sel, seeds[0])
    else:
      selected = self._select_tokens(ids, ok, n_sel, seeds[0])
      word_id = None

    # 80/10/10, one draw per word (per span with n-grams).
    r = tf.random.stateless_uniform(shape, seeds[1])
    if word_id is not None:
      r = tf.gather(r, word_id, batch_dims=1)
    to_mask = selected & (r < self.mask_token_prob)
    to_random = selected & (r >= self.mask_token_prob) & (
        r < self.mask_token_prob + self.random_token_prob)
    pool = tf.constant(self.random_pool)
    rand_ids = tf.gather(pool, tf.random.stateless_uniform(
        shape, seeds[2], minval=0, maxval=len(self.random_pool),
        dtype=tf.int32))
    new_ids = tf.where(to_mask, self.mask_id, tf.where(to_random, rand_ids, ids))

    # Positions sorted ascending, padded to P.
    # The P smallest selected positions, ascending (top-k of -position).
    neg = tf.where(selected, -tf.range(t)[None, :], -t)
    neg = tf.pad(neg, [[0, 0], [0, tf.maximum(0, p - t)]], constant_values=-t)
    cand = -tf.math.top_k(neg, k=p, sorted=True).values
    real = cand < t
    positions = tf.where(real, cand, 0)
    masked_ids = tf.where(real, tf.gather(ids, positions, batch_dims=1), 0)
    return dict(
        input_ids=new_ids,
        masked_lm_positions=tf.ensure_shape(positions, [None, p]),
        masked_lm_ids=tf.ensure_shape(masked_ids, [None, p]),
        masked_lm_weights=tf.ensure_shape(tf.cast(real, tf.float32), [None, p]),
    )


  def _select_tokens(self, ids, ok, n_sel, seed):
    """Exactly n_sel random selectable tokens per row.

    Keys are distinct per row (random high bits, position low bits), so the
    n_sel smallest keys are exactly the tokens with key <= the n_sel-th.
    """
    shape = tf.shape(ids)
    p = min(self.max_predictions, ids.shape[1] or self.max_predictions)
    # Position in the low bits (4096 slots; a power of two >= T for longer
    # rows, e.g. 8,192-token context extension), random high bits: < 2^31.
    t = ids.shape[1]
    slots = 4096 if t is None or t <= 4096 else 1 << (int(t) - 1).bit_length()
    rnd = tf.random.stateless_uniform(shape, seed, minval=0,
                                      maxval=(1 << 31) // slots,
                                      dtype=tf.int32)
    key = rnd * slots + tf.range(shape[1])[None, :]
    key = tf.where(ok, key, tf.int32.max)
    neg, _ = tf.math.top_k(-key, k=p, sorted=True)  # smallest keys, ascending
    kth = -tf.gather(neg, tf.maximum(n_sel - 1, 0), batch_dims=1)
    return ok & (key <= kth[:, None]) & (n_sel > 0)[:, None]

  def _select_words(self, ids, ok, n_sel, seed):
    """Whole words in random order while the token count stays <= n_sel."""
    shape = tf.shape(ids)
    b, t = shape[0], shape[1]
    starts = tf.gather(tf.constant(self.word_start), ids) | ~ok
    after_special = tf.pad(~ok[:, :-1], [[0, 0], [1, 0]], constant_values=True)
    starts = starts | after_special
    word_id = tf.maximum(tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1, 0)
    flat_word = word_id + t * tf.range(b)[:, None]
    word_len = tf.reshape(
        tf.math.unsorted_segment_sum(
            tf.reshape(tf.cast(ok, tf.int32), [-1]),
            tf.reshape(flat_word, [-1]), b * t), shape)  # [B, words<=T]
    score = tf.random.stateless_uniform(shape, seed)
    score = tf.where(word_len > 0, score, 2.0)
    order = tf.argsort(score, axis=1, stable=True)
    sorted_len = tf.gather(word_len, order, batch_dims=1)
    taken = ((tf.cumsum(sorted_len, axis=1) <= n_sel[:, None])
             & (sorted_len > 0))
    inverse = tf.argsort(order, axis=1, stable=True)
    word_taken = tf.gather(taken, inverse, batch_dims=1)
    return tf.gather(word_taken, word_id, batch_dims=1) & ok, word_id


  def _unit_starts(self, ids, ok):
    """[B, T] bool: token starts a unit (a word or, without whole-word, any
    token); special tokens are units of their own."""
    if self.whole_word:
      starts = tf.gather(tf.constant(self.word_start), ids) | ~ok
    else:
      starts = tf.ones_like(ok)
    after_special = tf.pad(~ok[:, :-1], [[0, 0], [1, 0]], constant_values=True)
    return starts | after_special

  def _select_spans(self, ids, ok, n_sel, seed, length_seed):
    """N-gram spans of units; returns (selected [B,T], span id [B,T])."""
    shape = tf.shape(ids)
    b, t = shape[0], shape[1]
    unit_start = self._unit_starts(ids, ok)
    unit_id = tf.cumsum(tf.cast(unit_start, tf.int32), axis=1) - 1
    # Span lengths (in units) n ~ 1/n, laid end to end from unit 0.
    probs = 1.0 / np.arange(1, self.max_ngram + 1)
    logits = tf.constant(np.log(probs / probs.sum())[None], tf.float32)
    lengths = tf.random.stateless_categorical(
        tf.tile(logits, [b, 1]), t, length_seed, dtype=tf.int32) + 1
    first_unit = tf.cumsum(lengths, axis=1, exclusive=True)  # Increasing.
    chunk_of_unit = tf.searchsorted(
        first_unit, tf.tile(tf.range(t)[None], [b, 1]), side="right") - 1
    chunk = tf.gather(chunk_of_unit, unit_id, batch_dims=1)
    prev_chunk = tf.pad(chunk[:, :-1], [[0, 0], [1, 0]], constant_values=-1)
    after_special = tf.pad(~ok[:, :-1], [[0, 0], [1, 0]], constant_values=True)
    span_start = (chunk != prev_chunk) | ~ok | after_special
    span_id = tf.cumsum(tf.cast(span_start, tf.int32), axis=1) - 1
    flat = span_id + t * tf.range(b)[:, None]
    span_len = tf.reshape(tf.math.unsorted_segment_sum(
        tf.reshape(tf.cast(ok, tf.int32), [-1]), tf.reshape(flat, [-1]),
        b * t), shape)  # Selectable tokens per span id.
    score = tf.random.stateless_uniform(shape, seed)
    order = tf.argsort(tf.where(span_len > 0, score, 2.0), axis=1, stable=True)
    sorted_len = tf.gather(span_len, order, batch_dims=1)
    taken = tf.zeros(shape, tf.bool)
    remaining = n_sel[:, None]
    for _ in range(3):  # Each pass: the spans that still fit, in order.
      fits = ~taken & (sorted_len > 0) & (sorted_len <= remaining)
      new = fits & (tf.cumsum(tf.where(fits, sorted_len, 0), axis=1)
                    <= remaining)
      taken = taken | new
      remaining = remaining - tf.reduce_sum(tf.where(new, sorted_len, 0),
                                            axis=1, keepdims=True)
    span_taken = tf.gather(taken, tf.argsort(order, axis=1, stable=True),
                           batch_dims=1)
    return tf.gather(span_taken, span_id, batch_dims=1) & ok, span_id


def unmasked_ids(batch: dict) -> np.ndarray:
  """A host batch's input_ids [B, T] as they were before masking: each
  weighted masked position gets its original id (masked_lm_ids) back. What
  a reader of batches needs to see which tokens a row really holds (its
  special tokens, its source's words), whatever replaced them."""
  ids = batch["input_ids"].copy()
  rows, cols = np.nonzero(batch["masked_lm_weights"] > 0)
  ids[rows, batch["masked_lm_positions"][rows, cols]] = (
      batch["masked_lm_ids"][rows, cols])
  return ids
