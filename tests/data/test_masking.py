"""In-graph MLM masking: statistics over >= 100k tokens with fixed seeds."""


import numpy as np
import pytest
import tensorflow as tf

from tests import helpers

bench_input = helpers.import_tool("bench_input")  # The numpy baseline.

from tests.helpers import masking_corpus
from tests.helpers.masking_corpus import P
from tests.helpers.masking_corpus import T
from tests.helpers.masking_corpus import make
from tests.helpers.masking_corpus import outcomes
from tests.helpers.masking_corpus import run


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  return masking_corpus.corpus(tmp_path_factory.mktemp("mask"))










@pytest.mark.slow
def test_selection_rate_and_80_10_10(data):
  tok, ids = data
  out = run(make(tok), ids)
  special = np.isin(ids, tok.special_ids)
  n_ok = (~special).sum(1)
  assert n_ok.sum() >= 100_000
  w = out["masked_lm_weights"]
  n_sel = w.sum(1).astype(int)
  want = np.minimum(P, np.maximum(1, np.round(0.15 * n_ok).astype(int)))
  np.testing.assert_array_equal(n_sel, want)
  rate = n_sel.sum() / n_ok.sum()
  assert abs(rate - 0.15) < 0.005, rate
  kind, rows, pos = outcomes(ids, out, tok)
  assert not special[rows, pos].any()  # never [CLS]/[SEP]/[PAD]
  frac = np.bincount(kind, minlength=3) / len(kind)
  assert abs(frac[0] - 0.8) < 0.015 and abs(frac[1] - 0.1) < 0.015 and abs(
      frac[2] - 0.1) < 0.015, frac
  # Positions ascending, padding is position 0 / id 0 / weight 0.
  p = np.where(w > 0, out["masked_lm_positions"], T + 1)
  assert (np.diff(p, axis=1) >= 0).all()
  assert (out["masked_lm_positions"][w == 0] == 0).all()
  assert (out["masked_lm_ids"][w == 0] == 0).all()
  # Unselected tokens untouched; random replacements are never special.
  changed = out["input_ids"] != ids
  sel = np.zeros_like(changed)
  sel[rows, pos] = True
  assert not (changed & ~sel).any()
  assert not np.isin(out["input_ids"][rows, pos][kind == 1], tok.special_ids).any()


def test_whole_word_grouping(data):
  tok, ids = data
  out = run(make(tok, whole_word=True), ids, seed=1)
  ws = tok.word_start[ids]
  special = np.isin(ids, tok.special_ids)
  kind, rows, pos = outcomes(ids, out, tok)
  n_ok = (~special).sum()
  rate = len(kind) / n_ok
  assert 0.13 < rate <= 0.15, rate
  sel = np.zeros(ids.shape, bool)
  sel[rows, pos] = True
  kmap = np.full(ids.shape, -1)
  kmap[rows, pos] = kind
  n_multi = 0
  for r in range(ids.shape[0]):
    # Words: a word-start (or first token after a special) + continuations.
    word = np.cumsum(ws[r] | special[r] | np.r_[True, special[r][:-1]])
    for wid in np.unique(word[sel[r]]):
      members = (word == wid) & ~special[r]
      assert sel[r][members].all(), "word partially selected"
      k = kmap[r][members]
      n_multi += members.sum() > 1
      assert (k == 0).all() or (k != 0).all(), "pieces disagree on [MASK]"
  assert n_multi > 100
  frac = np.bincount(kind, minlength=3) / len(kind)
  assert abs(frac[0] - 0.8) < 0.015 and abs(frac[1] + frac[2] - 0.2) < 0.015


@pytest.mark.slow
def test_deterministic_and_dynamic(data):
  tok, ids = data
  m = make(tok)
  a, b, c = run(m, ids[:256], 7), run(m, ids[:256], 7), run(m, ids[:256], 8)
  np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
  assert (a["masked_lm_positions"] != c["masked_lm_positions"]).any()


def test_row_without_selectable_tokens(data):
  tok, _ = data
  row = np.full([1, T], tok.pad_id, np.int32)
  row[0, :2] = [tok.cls_id, tok.sep_id]
  out = make(tok)(tf.constant(row), tf.constant([0, 0], tf.int64))
  assert out["masked_lm_weights"].numpy().sum() == 0
  np.testing.assert_array_equal(out["input_ids"].numpy(), row)


def test_numpy_collator_reference(data):
  tok, ids = data
  table = np.zeros(tok.vocab_size, bool)
  table[tok.special_ids] = True
  out, labels = bench_input.numpy_mask_batch(
      ids, np.random.default_rng(0), special_mask_table=table,
      mask_id=tok.mask_id, vocab_size=tok.vocab_size)
  sel = labels != -100
  assert abs(sel.sum() / (~table[ids]).sum() - 0.15) < 0.005
  assert abs((out[sel] == tok.mask_id).mean() - 0.8) < 0.015
