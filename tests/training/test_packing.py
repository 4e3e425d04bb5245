"""Packed pretraining end to end: the same losses on 1 and 8 devices, and a
run killed with SIGKILL that resumes exactly.

The resumed run redoes the steps after its last checkpoint; the killed run
logged them before it died, so the two logs must agree on every such step
(no separate reference run: the killed run is the reference up to its kill).
"""

import os

import pytest

from tests import helpers
from tests.helpers import REPO
from tests.helpers import TINY_OVERRIDES
from tests.helpers import family_checks

pytestmark = pytest.mark.slow

SAVE_EVERY = 5
NUM_STEPS = 14
KILL_AT = 7  # Logged; the next checkpoint (10) is 3 steps away.
FLAGS = (*TINY_OVERRIDES,
         "--config.data.seq_length=64",
         "--config.model.max_position_embeddings=64",
         "--config.data.max_predictions_per_seq=10",
         "--config.data.short_seq_prob=0.5",  # Short pairs: rows hold several.
         "--config.data.packing=True",
         "--config.data.packing_max_sequences=6",
         "--config.data.packing_window=64",
         f"--config.train.num_steps={NUM_STEPS}",
         "--config.train.log_every=1",
         "--config.train.eval_every=100000",
         f"--config.checkpoint.save_every_steps={SAVE_EVERY}",
         "--config.checkpoint.async_save=False")


@pytest.mark.parametrize("family", ["bert_packed", "modernbert_packed"])
def test_one_and_eight_devices_agree_on_packed_batches(tmp_path, family):
  """DP 8, FSDP 8, DP 4 x TP 2 against one device on packed rows (per-
  document positions, block-diagonal masks; ModernBERT's sliding window
  within each document)."""
  family_checks.assert_meshes_agree(family, tmp_path)


def test_packed_run_resumes_exactly_after_kill9(tmp_path):
  """Killed with SIGKILL after step 7 (checkpoint 5), the rerun redoes
  steps 6-7 with the killed run's losses bit for bit."""
  workdir = str(tmp_path / "run")
  resumed = helpers.assert_resumes_exactly_after_kill9(
      "main", ["--config", os.path.join(REPO, "configs", "tiny.py"),
               "--workdir", workdir, *FLAGS], workdir, kill_after=KILL_AT,
      save_every=SAVE_EVERY, num_steps=NUM_STEPS)
  log = helpers.run_log(workdir)
  # Throughput beside it: real tokens, the share of row slots they fill.
  for r in resumed:
    assert 0.8 < r["packing_efficiency"] <= 1.0, r
    assert abs(r["real_tokens_per_sec"] - r["tokens_per_sec"] * r[
        "packing_efficiency"]) < 1e-6 * r["tokens_per_sec"]
  assert "of slots)" in log
