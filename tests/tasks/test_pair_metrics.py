"""Pair scores against references on the same inputs: STS correlations
equal scipy's, the best-threshold paraphrase scores a brute-force search
(and sentence-transformers' own search), average precision
scikit-learn's."""

import numpy as np
import pytest

from bert_jax.tasks import pair_metrics

scipy_stats = pytest.importorskip("scipy.stats")


def _pairs(seed, n=300, ties=True):
  r = np.random.RandomState(seed)
  sim = r.uniform(-0.2, 1.0, n)
  if ties:  # Equal similarities (duplicate pairs) happen in real data.
    sim = np.round(sim, 2)
  labels = (sim + r.normal(0, 0.3, n) > 0.5).astype(np.int64)
  return sim, labels


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sts_correlations_equal_scipys(seed):
  r = np.random.RandomState(seed)
  gold = np.round(r.uniform(0, 5, 200), 1)  # STS-B style, many ties
  sim = np.round(gold / 5 + r.normal(0, 0.2, 200), 3)
  out = pair_metrics.sts(sim, gold)
  assert abs(out["spearman"] - scipy_stats.spearmanr(gold, sim)[0]) < 1e-12
  assert abs(out["pearson"] - scipy_stats.pearsonr(gold, sim)[0]) < 1e-12


def _brute_force(sim, labels):
  """Every cut between distinct similarities (and none): the best
  accuracy and F1, positives at or above the cut."""
  cuts = np.r_[np.unique(sim), np.inf]
  acc = max(np.mean((sim >= t) == labels) for t in cuts)
  f1s = []
  for t in cuts:
    pred = sim >= t
    tp = np.sum(pred & (labels == 1))
    f1s.append(2 * tp / (pred.sum() + labels.sum()) if tp else 0.0)
  return acc, max(f1s)


@pytest.mark.parametrize("seed,ties", [(0, True), (1, True), (2, False)])
def test_best_threshold_scores_equal_a_brute_force_search(seed, ties):
  sim, labels = _pairs(seed, ties=ties)
  out = pair_metrics.binary(sim, labels)
  acc, f1 = _brute_force(sim, labels)
  assert abs(out["accuracy"] - acc) < 1e-12
  assert abs(out["f1"] - f1) < 1e-12
  # The thresholds reproduce the scores.
  assert abs(np.mean((sim >= out["accuracy_threshold"]) == labels) -
             out["accuracy"]) < 1e-12
  pred = sim >= out["f1_threshold"]
  tp = np.sum(pred & (labels == 1))
  assert abs(2 * tp / (pred.sum() + labels.sum()) - out["f1"]) < 1e-12


def test_binary_scores_equal_sentence_transformers_and_sklearn():
  st_eval = pytest.importorskip(
      "sentence_transformers.sentence_transformer.evaluation")
  metrics = pytest.importorskip("sklearn.metrics")
  search = st_eval.BinaryClassificationEvaluator
  for seed in range(3):
    sim, labels = _pairs(seed)
    out = pair_metrics.binary(sim, labels)
    acc, acc_t = search.find_best_acc_and_threshold(sim, labels, True)
    f1, precision, recall, f1_t = search.find_best_f1_and_threshold(
        sim, labels, True)
    np.testing.assert_allclose(
        [out["accuracy"], out["accuracy_threshold"], out["f1"],
         out["precision"], out["recall"], out["f1_threshold"]],
        [acc, acc_t, f1, precision, recall, f1_t], atol=1e-12)
    assert abs(out["average_precision"] - metrics.average_precision_score(
        labels, sim)) < 1e-12
