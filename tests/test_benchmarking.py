"""bert_jax/benchmarking.py: the timing harness every speed tool uses, and
its compiled train step."""

import numpy as np
import pytest

from bert_jax import benchmarking
from tests import helpers


class Recorder(benchmarking.Side):
  """A side whose steps log (name, batch index) instead of computing."""

  def __init__(self, name, log, num_batches=3):
    super().__init__(num_batches)
    self.name, self.log = name, log

  def step(self, k):
    self.log.append((self.name, k))
    return k * 10


def test_warmup_is_untimed_and_rounds_alternate():
  log = []
  a, b = Recorder("a", log), Recorder("b", log, num_batches=2)
  rounds_done = []
  benchmarking.alternate([a, b], warmup=2, rounds=3, steps=2,
                         between_rounds=lambda: rounds_done.append(len(log)))
  # Warm-up first (2 each), then a, a, b, b per round.
  assert log[:4] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
  assert [n for n, _ in log[4:]] == ["a", "a", "b", "b"] * 3
  assert rounds_done == [8, 12, 16]
  # Only the timed steps are recorded; batches cycle on from the warm-up.
  assert len(a.times) == len(b.times) == 6
  assert a.batches == [2, 0, 1, 2, 0, 1] and b.batches == [0, 1] * 3
  assert a.outputs == [10 * k for k in a.batches]
  assert all(t >= 0 for t in a.times)


def test_stats_are_min_median_p90_max():
  s = benchmarking.stats([0.3, 0.1, 0.2, 0.5, 0.4])
  assert (s["min"], s["p50"], s["max"], s["n"]) == (0.1, 0.3, 0.5, 5)
  assert s["p90"] == pytest.approx(0.46)
  assert s["mean"] == pytest.approx(0.3)


def test_synthetic_batches_mask_real_distinct_tokens():
  for b in benchmarking.synthetic_batches(3, 8, 32, 5, 256, seed=1):
    assert b["input_ids"].shape == (8, 32) and b["input_mask"][0].all()
    lengths = b["input_mask"].sum(1)
    for row, n in enumerate(lengths):
      k = int(b["masked_lm_weights"][row].sum())
      positions = b["masked_lm_positions"][row, :k]
      assert k == min(5, max(1, round(0.15 * n)))
      assert len(set(positions)) == k and 0 < positions.min()
      assert positions.max() < n  # Real tokens only.
      assert (b["input_ids"][row, n:] == 0).all()


def test_ours_times_the_compiled_train_step():
  config = helpers.tiny_config(
      model=dict(vocab_size=256, intermediate_size=128),
      train=dict(batch_size=8))
  ours = benchmarking.Ours(config, num_batches=2)
  assert ours.compile_seconds > 0 and ours.memory_mb > 0
  assert int(ours.state["step"]) == 0
  benchmarking.alternate([ours], warmup=1, rounds=2, steps=2)
  assert len(ours.times) == 4 and ours.batches == [1, 0, 1, 0]
  assert int(ours.state["step"]) == 5  # Warm-up and timed steps trained.
  assert np.isfinite(ours.times).all()
