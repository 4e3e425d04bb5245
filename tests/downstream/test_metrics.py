"""Downstream metrics against hand computations on small fixed arrays."""

import numpy as np
import pytest
from scipy import stats

from bert_jax.data import task_sources
from bert_jax.tasks import sentence_metrics

# Six rows; the last has weight 0 (a padding row) and must not count.
LABELS = np.array([1, 0, 1, 1, 0, 1])
PREDS = np.array([1, 0, 0, 1, 1, 1])
W = np.array([1, 1, 1, 1, 1, 0], np.float32)


def test_binary_metrics_by_hand():
  # Rows 0-4: TP = rows 0,3 (2); TN = row 1 (1); FP = row 4; FN = row 2.
  assert sentence_metrics.accuracy(LABELS, PREDS, W) == pytest.approx(3 / 5)
  assert sentence_metrics.f1(LABELS, PREDS, W) == pytest.approx(2 * 2 / (2 * 2 + 1 + 1))
  # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = 1/sqrt(36)
  assert sentence_metrics.matthews_corrcoef(LABELS, PREDS, W) == pytest.approx(1 / 6)
  # Unweighted, row 5 (a TP) counts: acc 4/6, F1 = 6/(6+1+1).
  assert sentence_metrics.accuracy(LABELS, PREDS) == pytest.approx(4 / 6)
  assert sentence_metrics.f1(LABELS, PREDS) == pytest.approx(6 / 8)


def test_weight_zero_rows_are_ignored_whatever_they_hold():
  preds = PREDS.copy()
  preds[5] = 0  # flip the padding row's prediction
  labels = LABELS.copy()
  labels[5] = 7  # and give it a label no real row has
  for fn in (sentence_metrics.accuracy, sentence_metrics.f1, sentence_metrics.matthews_corrcoef, sentence_metrics.pearson,
             sentence_metrics.spearman):
    assert fn(labels, preds, W) == pytest.approx(fn(LABELS, PREDS, W)), fn


def test_weights_count_as_copies():
  w = np.array([2, 1, 1, 3, 1, 0.0])
  rep = np.repeat(np.arange(6), w.astype(int))
  for fn in (sentence_metrics.accuracy, sentence_metrics.f1, sentence_metrics.matthews_corrcoef, sentence_metrics.pearson):
    assert fn(LABELS, PREDS, w) == pytest.approx(fn(LABELS[rep], PREDS[rep]))


def test_multiclass_mcc_by_hand():
  # Confusion (true x pred): [[2,0,0],[0,0,1],[0,0,1]]; t=[2,1,1], p=[2,0,2],
  # s=4, c=3: (c*s - t.p) / sqrt((s^2 - p.p)(s^2 - t.t)) = 6 / sqrt(8 * 10).
  got = sentence_metrics.matthews_corrcoef([0, 1, 2, 0], [0, 2, 2, 0])
  assert got == pytest.approx(6 / np.sqrt(80))


def test_degenerate_inputs_give_zero_not_nan():
  ones = np.ones(5, int)
  assert sentence_metrics.matthews_corrcoef(ones, ones) == 0.0  # one class on both sides
  assert sentence_metrics.matthews_corrcoef([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0
  assert sentence_metrics.f1([0, 0, 0], [0, 0, 0]) == 0.0       # no positive anywhere
  assert sentence_metrics.pearson([1, 2, 3], [5, 5, 5]) == 0.0  # constant prediction
  assert sentence_metrics.accuracy([1, 0], [1, 0], [0, 0]) == 0.0  # nothing weighted
  assert sentence_metrics.spearman([1, 2], [2, 1], [0, 0]) == 0.0


def test_pearson_and_spearman_by_hand():
  # x mean 2.5, y mean 5; dx=[-1.5,-.5,.5,1.5], dy=[-3,-1,0,4]:
  # cov=11, var x=5, var y=26 -> 11/sqrt(130).
  assert sentence_metrics.pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(
      11 / np.sqrt(130))
  # Ties share average ranks: x=[1,2,2,3] -> [1,2.5,2.5,4]; y -> [1,3,2,4].
  np.testing.assert_allclose(sentence_metrics.average_ranks(np.array([1, 2, 2, 3])),
                             [1, 2.5, 2.5, 4])
  # dx=[-1.5,0,0,1.5], dy=[-1.5,.5,-.5,1.5]: cov=4.5, vx=4.5, vy=5.
  assert sentence_metrics.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(
      4.5 / np.sqrt(4.5 * 5))


def test_spearman_and_pearson_match_scipy_with_ties():
  rng = np.random.default_rng(0)
  x = rng.integers(0, 6, 200).astype(float)  # many ties
  y = x + rng.normal(0, 2, 200).round()
  assert sentence_metrics.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0], 1e-12)
  assert sentence_metrics.pearson(x, y) == pytest.approx(stats.pearsonr(x, y)[0], 1e-12)


def test_official_metric_set_per_glue_task():
  expect = {
      "cola": ("matthews_corrcoef",), "sst2": ("accuracy",),
      "mrpc": ("f1", "accuracy"), "qqp": ("f1", "accuracy"),
      "stsb": ("pearson", "spearman"), "mnli": ("accuracy",),
      "qnli": ("accuracy",), "rte": ("accuracy",), "wnli": ("accuracy",)}
  for name, metrics in expect.items():
    assert task_sources.glue_task(name).metrics == metrics, name
  assert task_sources.glue_task("mnli").eval_splits == ("validation_matched",
                                              "validation_mismatched")
  got = sentence_metrics.task_scores(task_sources.glue_task("mrpc"), LABELS, PREDS, W)
  assert got == pytest.approx({"f1": 2 / 3, "accuracy": 0.6})
  stsb = sentence_metrics.task_scores(task_sources.glue_task("stsb"), [1, 2, 3, 4], [2, 4, 5, 9])
  assert set(stsb) == {"pearson", "spearman"} and stsb["spearman"] == 1.0


def test_predictions_from_logits():
  logits = np.array([[0.1, 2.0], [3.0, -1.0]])
  np.testing.assert_array_equal(
      sentence_metrics.predictions(logits, task_sources.glue_task("sst2")), [1, 0])
  np.testing.assert_allclose(
      sentence_metrics.predictions(np.array([[0.5], [4.0]]), task_sources.glue_task("stsb")),
      [0.5, 4.0])


def test_glue_average_reproduces_devlin_table1():
  # BERT-base row of Devlin et al. 2019 Table 1 (F1 for QQP/MRPC, Spearman for
  # STS-B, as that table reports): the "Average" column reads 79.6.
  r = {"mnli": {"validation_matched": {"accuracy": .846},
                "validation_mismatched": {"accuracy": .834}},
       "qqp": {"validation": {"f1": .712}},
       "qnli": {"validation": {"accuracy": .905}},
       "sst2": {"validation": {"accuracy": .935}},
       "cola": {"validation": {"matthews_corrcoef": .521}},
       "stsb": {"validation": {"spearman": .858}},
       "mrpc": {"validation": {"f1": .889}},
       "rte": {"validation": {"accuracy": .664}}}
  assert sentence_metrics.glue_average(r) == pytest.approx(.796, abs=5e-4)
  # Two metrics -> their mean: (0.8 + 0.6) / 2 and (0.9 + 0.7) / 2 -> 0.75.
  two = {"mrpc": {"validation": {"f1": .8, "accuracy": .6}},
         "stsb": {"validation": {"pearson": .9, "spearman": .7}}}
  assert sentence_metrics.glue_average(two) == pytest.approx(0.75)
  table = sentence_metrics.format_table(two)
  assert "mrpc" in table and "average" in table and "75.00" in table
