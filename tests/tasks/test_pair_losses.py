"""The pairs kind's losses as pure functions: what a duplicate text, a
padding row and a Matryoshka prefix do (the library parity of the values
is tests/downstream/test_pairs_parity.py)."""

import numpy as np

from bert_jax.tasks import pair_losses

SCALE = 20.0


def _vectors(b, k=2, d=8, seed=0):
  return np.random.RandomState(seed).randn(b, k, d).astype(np.float32)


def _reference(vectors, keep):
  """Mean over anchors of -log softmax of the positive among the kept
  candidates (numpy, float64); keep[i] lists (row, slot) candidates."""
  unit = vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)
  out = []
  for i, cands in enumerate(keep):
    s = np.asarray([SCALE * unit[i, 0] @ unit[r, c] for r, c in cands],
                   np.float64)
    pos = cands.index((i, 1))
    out.append(np.log(np.sum(np.exp(s))) - s[pos])
  return np.mean(out)


def test_in_batch_negatives_are_every_other_positive_and_negative():
  v = _vectors(4, k=3)
  ids = np.arange(12, dtype=np.int32).reshape(4, 3)
  total, count = pair_losses.info_nce(v, np.ones(4), ids, scale=SCALE)
  keep = [[(r, c) for c in (1, 2) for r in range(4)] for _ in range(4)]
  np.testing.assert_allclose(float(total) / float(count),
                             _reference(v, keep), rtol=1e-5)


def test_a_duplicate_text_is_no_negative():
  """Row 1's positive is row 0's positive text, row 2's anchor is row 0's
  anchor text, row 3's negative is row 0's anchor text: none of them is a
  negative for anchor 0 (its own positive stays); distinct ids would make
  them negatives and give another loss."""
  v = _vectors(4, k=3)
  ids = np.arange(12, dtype=np.int32).reshape(4, 3)
  for (r, c), (r0, c0) in (((1, 1), (0, 1)), ((2, 0), (0, 0)),
                           ((3, 2), (0, 0))):  # Same text, same vector.
    ids[r, c], v[r, c] = ids[r0, c0], v[r0, c0]
  total, _ = pair_losses.info_nce(v, np.ones(4), ids, scale=SCALE)
  every = [(r, c) for c in (1, 2) for r in range(4)]
  keep = [
      [x for x in every if x not in ((1, 1), (2, 1), (3, 2))],  # anchor 0
      [x for x in every if x not in ((0, 1),)],  # its positive's copy
      [x for x in every if x not in ((0, 1), (3, 2))],  # anchor 0's text
      every]
  np.testing.assert_allclose(float(total) / 4, _reference(v, keep),
                             rtol=1e-5)
  plain, _ = pair_losses.info_nce(
      v, np.ones(4), np.arange(12, dtype=np.int32).reshape(4, 3),
      scale=SCALE)
  assert float(plain) - float(total) > 1.0  # Copies as negatives hurt.


def test_padding_rows_and_empty_slots_take_no_part():
  v = _vectors(6, k=3)
  ids = np.arange(18, dtype=np.int32).reshape(6, 3)
  ids[4:] = -1
  w = np.asarray([1, 1, 1, 1, 0, 0], np.float32)
  total, count = pair_losses.info_nce(v, w, ids, scale=SCALE)
  alone, n = pair_losses.info_nce(v[:4], np.ones(4), ids[:4], scale=SCALE)
  assert float(count) == float(n) == 4
  np.testing.assert_allclose(float(total), float(alone), rtol=1e-6)
  sym, _ = pair_losses.info_nce(v, w, ids, scale=SCALE, symmetric=True)
  sym_alone, _ = pair_losses.info_nce(v[:4], np.ones(4), ids[:4],
                                      scale=SCALE, symmetric=True)
  np.testing.assert_allclose(float(sym), float(sym_alone), rtol=1e-6)
  scores = np.asarray([0.1, 2.0, 4.5, 3.0, 5.0, 0.0], np.float32)
  np.testing.assert_allclose(
      float(pair_losses.cosent(v, w, scores, scale=SCALE)),
      float(pair_losses.cosent(v[:4], np.ones(4), scores[:4], scale=SCALE)),
      rtol=1e-6)


def test_cosent_is_log_one_plus_the_misordered_pairs():
  v = _vectors(5)
  scores = np.asarray([0.5, 4.0, 2.5, 2.5, 1.0], np.float32)
  unit = v / np.linalg.norm(v, axis=-1, keepdims=True)
  s = SCALE * np.sum(unit[:, 0] * unit[:, 1], axis=-1).astype(np.float64)
  terms = [np.exp(s[i] - s[j]) for i in range(5) for j in range(5)
           if scores[i] < scores[j]]
  np.testing.assert_allclose(
      float(pair_losses.cosent(v, np.ones(5), scores, scale=SCALE)),
      np.log1p(np.sum(terms)), rtol=1e-5)


def test_matryoshka_sums_the_loss_of_each_prefix():
  v = _vectors(4, d=16)
  ids = np.arange(8, dtype=np.int32).reshape(4, 2)
  loss = lambda x: pair_losses.info_nce(x, np.ones(4), ids, scale=SCALE)
  total, count = pair_losses.matryoshka(loss, v, (16, 4))
  assert float(count) == 4
  np.testing.assert_allclose(
      float(total), float(loss(v)[0]) + float(loss(v[..., :4])[0]),
      rtol=1e-6)
