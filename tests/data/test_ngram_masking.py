"""N-gram span masking (ALBERT, data.max_ngram > 1) on a small hand-made
batch: the budget is filled, spans make runs of adjacent masked tokens,
words stay whole and a span shares one outcome. (The span-length and
80/10/10 statistics on a real corpus are checked in the slow tier.)"""

import numpy as np
import pytest
import tensorflow as tf

from bert_jax.data import masking

VOCAB, T, ROWS, P = 60, 40, 64, 8
PAD, UNK, CLS, SEP, MASK = range(5)
CONTINUATION = 40  # Ids from here on are word pieces that continue a word.


def _rows() -> np.ndarray:
  """[CLS] tokens [SEP] [PAD]...: rows of 12..39 tokens."""
  r = np.random.default_rng(0)
  ids = np.full((ROWS, T), PAD, np.int32)
  for i in range(ROWS):
    n = r.integers(12, T)
    ids[i, 0], ids[i, 1:n - 1], ids[i, n - 1] = CLS, r.integers(5, VOCAB,
                                                                 n - 2), SEP
  return ids


def _mask(ids, seed=(1, 2), **options):
  """Selected [B, T] and the masked ids; half [MASK], half kept."""
  word_start = np.arange(VOCAB) < CONTINUATION
  masker = masking.Masker(
      vocab_size=VOCAB, special_ids=(PAD, UNK, CLS, SEP, MASK), mask_id=MASK,
      max_predictions=P, mask_token_prob=0.5, random_token_prob=0.0,
      word_start=word_start, **options)
  out = masker(tf.constant(ids), tf.constant(seed, tf.int64))
  out = {k: v.numpy() for k, v in out.items()}
  selected = np.zeros(ids.shape, bool)
  real = out["masked_lm_weights"] > 0
  selected[np.nonzero(real)[0], out["masked_lm_positions"][real]] = True
  return selected, out["input_ids"]


def _budget(ids) -> np.ndarray:
  """Tokens to select per row: round(15% of the non-special ones), 1..P."""
  n = np.round(0.15 * (ids > MASK).sum(axis=1))
  return np.minimum(P, np.maximum(1, n)).astype(int)


def _adjacent_share(selected) -> float:
  """Of the selected tokens, the share whose right neighbour is selected."""
  return (selected[:, :-1] & selected[:, 1:]).sum() / selected.sum()


def test_spans_fill_the_budget_and_come_in_runs():
  ids = _rows()
  single, _ = _mask(ids, max_ngram=1)
  spans, _ = _mask(ids, max_ngram=3)
  for selected in (single, spans):
    assert (selected.sum(axis=1) == _budget(ids)).all()
    assert not selected[ids <= MASK].any()  # Never a special token.
  # Spans of 1-3 tokens (p ~ 1/n): ~4x the adjacent pairs of single tokens.
  assert _adjacent_share(single) < 0.15 < 0.25 < _adjacent_share(spans)
  again, _ = _mask(ids, max_ngram=3)
  other, _ = _mask(ids, seed=(1, 3), max_ngram=3)
  assert (again == spans).all() and (other != spans).any()


def test_whole_word_spans_keep_words_whole_with_one_outcome():
  ids = _rows()
  selected, masked = _mask(ids, max_ngram=3, whole_word=True)
  assert (selected.sum(axis=1) <= _budget(ids)).all()
  assert selected.sum() >= 0.95 * _budget(ids).sum()
  words = 0
  for row in range(ROWS):
    start = None
    for t in range(T + 1):
      continues = t < T and ids[row, t] >= CONTINUATION and start is not None
      if continues:
        continue
      if start is not None and t - start > 1:  # A word of several pieces.
        words += 1
        assert len(set(selected[row, start:t])) == 1, (row, start, t)
        if selected[row, start]:  # One outcome: all [MASK] or all kept.
          assert len(set(masked[row, start:t] == MASK)) == 1, (row, start)
      start = t if t < T and ids[row, t] > MASK else None
  assert words > 100


def test_max_ngram_below_one_is_refused():
  with pytest.raises(ValueError, match=r"^data.max_ngram=0 must be >= 1 "
                     r"\(1: no n-gram spans\).$"):
    masking.Masker(vocab_size=VOCAB, special_ids=(PAD,), mask_id=MASK,
                   max_predictions=P, max_ngram=0)
