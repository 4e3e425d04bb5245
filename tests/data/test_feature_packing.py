"""Packed rows of precomputed features (token tagging) on the host.

The numpy best-fit decreasing places every window exactly as the tf.data
packer of sentence tasks does; a packed row holds each feature's tokens,
per-token labels and weights at its own offset, with its own positions and
sequence id; evaluation puts every feature in exactly one slot; the packed
training iterator visits every feature once an epoch and resumes exactly
from its saved state, and refuses a state of another layout in one line.
"""

import json

import numpy as np
import pytest

from bert_jax.data import feature_batches
from bert_jax.data import feature_packing

SHAPE = feature_packing.Shape(seq_length=32, max_sequences=5, window=16)


def _features(n=61, seq=32, seed=0, segment_start=False):
  """Windows of 3..seq tokens, mostly short (as NER sentences), with a
  label and a weight per token and a per-feature array."""
  r = np.random.RandomState(seed)
  lengths = np.minimum(r.geometric(0.12, n) + 2, seq).astype(np.int32)
  real = np.arange(seq)[None] < lengths[:, None]
  ids = np.where(real, r.randint(5, 90, (n, seq)), 0).astype(np.int32)
  return feature_batches.Features(
      ids, lengths,
      dict(labels=np.where(real, r.randint(0, 7, (n, seq)), 0).astype(
          np.int32),
           label_weights=(real & (r.rand(n, seq) < 0.6)).astype(np.float32),
           start_positions=np.arange(n, dtype=np.int32)),
      segment_start=(r.randint(1, 4, n).astype(np.int32) if segment_start
                     else None))


def test_best_fit_decreasing_places_as_the_tf_data_packer():
  tf = pytest.importorskip("tensorflow")
  from bert_jax.data import packing
  r = np.random.RandomState(1)
  for trial in range(20):
    lengths = r.randint(1, 33, r.randint(1, 80))
    cap, s = 32, int(r.randint(1, 7))
    rows = feature_packing.best_fit_decreasing(lengths, cap, s)
    row, slot, offset, num = (np.asarray(x) for x in
                              packing.best_fit_decreasing(
                                  tf.constant(lengths), cap, s))
    assert len(rows) == int(num), trial
    for r_, members in enumerate(rows):
      at = 0
      for k, e in enumerate(members):
        assert (row[e], slot[e], offset[e]) == (r_, k, at), (trial, e)
        at += lengths[e]
      assert at <= cap and len(members) <= s
    assert sorted(e for m in rows for e in m) == list(range(len(lengths)))


@pytest.mark.parametrize("segments", [False, True])
def test_a_packed_row_holds_each_feature_as_it_is_alone(segments):
  features = _features(segment_start=segments)
  rows = feature_packing.best_fit_decreasing(features.lengths, 32, 5)
  b = feature_packing.pack(features, rows, SHAPE, pad_id=1,
                           num_rows=len(rows) + 2)
  assert b["input_ids"].shape == (len(rows) + 2, 32)
  assert b["example_index"].shape == (len(rows) + 2, 5)
  seen = []
  for r, s in zip(*np.nonzero(b["example_weights"])):
    i = int(b["example_index"][r, s])
    n = int(features.lengths[i])
    alone = features.rows(np.asarray([i]), 32, pad_id=1)
    at = np.flatnonzero(b["sequence_ids"][r] == s + 1)
    start = int(b["cls_positions"][r, s])
    np.testing.assert_array_equal(at, np.arange(start, start + n))
    np.testing.assert_array_equal(b["position_ids"][r, at], np.arange(n))
    for k in ("input_ids", "input_mask", "segment_ids", "labels",
              "label_weights"):
      np.testing.assert_array_equal(b[k][r, at], alone[k][0, :n], err_msg=k)
    assert b["start_positions"][r, s] == i
    seen.append(i)
  assert sorted(seen) == list(range(len(features)))
  pad = b["input_mask"] == 0
  assert (b["input_ids"][pad] == 1).all() and (b["sequence_ids"][pad] == 0
                                               ).all()
  assert not b["label_weights"][pad].any()
  empty = b["example_weights"] == 0
  assert (b["example_index"][empty] == -1).all()
  assert not b["input_mask"][-2:].any()  # The rows asked for past `rows`.
  # Rows are full: most slots hold a token (the lengths are NER-like).
  assert b["input_mask"][:len(rows)].mean() > 0.9


def test_eval_batches_hold_every_feature_in_one_slot():
  features = _features(n=97)
  batches = feature_packing.eval_batches(features, batch_size=4, shape=SHAPE)
  idx = np.concatenate([b["example_index"].ravel() for b in batches])
  assert sorted(idx[idx >= 0]) == list(range(97))
  for b in batches:
    assert b["input_ids"].shape == (4, 32)
    np.testing.assert_array_equal(b["example_weights"] > 0,
                                  b["example_index"] >= 0)
  # Host slices of a global batch: process 1 of 2 keeps its 2 rows.
  half = feature_packing.eval_batches(features, batch_size=4, shape=SHAPE,
                                      process_index=1, process_count=2)
  np.testing.assert_array_equal(half[0]["input_ids"],
                                batches[0]["input_ids"][2:])


def test_train_iterator_visits_every_feature_and_resumes_exactly(tmp_path):
  features = _features()
  kw = dict(batch_size=3, seed=5, shape=SHAPE)
  it = feature_packing.PackedFeatureIterator(features, **kw)
  for _ in range(10):  # Until rows packed but not yet fed are part of it.
    assert "example_index" not in next(it)
    path = it.save(str(tmp_path))
    if json.load(open(path))["pending"]:
      break
  assert json.load(open(path))["pending"]
  expected = [next(it) for _ in range(40)]  # Crosses epoch boundaries.
  again = feature_packing.PackedFeatureIterator(features, **kw)
  again.restore(str(tmp_path))
  for a, b in zip(expected, (next(again) for _ in range(40))):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  # Each epoch visits every feature once (the per-feature array names it):
  # a few rows past an epoch's, every feature is seen once or twice.
  fresh = feature_packing.PackedFeatureIterator(features, **kw)
  epoch = feature_packing.rows_per_epoch(features, SHAPE)
  counts = np.zeros(len(features), int)
  for _ in range((epoch + 6) // 3 + 1):
    b = next(fresh)
    np.add.at(counts, b["start_positions"][b["example_weights"] > 0], 1)
  assert counts.min() == 1 and counts.max() <= 2, (epoch, counts)
  other = feature_packing.PackedFeatureIterator(features,
                                                **dict(kw, seed=6))
  with pytest.raises(ValueError, match="seed=5, this run has 6"):
    other.restore(str(tmp_path))


def test_a_bucketed_state_is_refused_by_the_packed_iterator(tmp_path):
  features = _features()
  bucketed = feature_batches.FeatureIterator(features, batch_size=3, seed=5,
                                             lengths=(16, 32))
  next(bucketed)
  bucketed.save(str(tmp_path))
  packed = feature_packing.PackedFeatureIterator(features, batch_size=3,
                                                 seed=5, shape=SHAPE)
  with pytest.raises(ValueError, match=r"for packing=None, this run has "
                     r"\{'seq_length': 32"):
    packed.restore(str(tmp_path))
