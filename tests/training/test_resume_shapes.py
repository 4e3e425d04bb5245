"""Resuming a workdir after changing the batch size or sequence length.

BERT's own recipe switches from 128 to 512 tokens (and another batch) late
in training, and other hardware fits another batch: the state restores and
the data position carries over as examples consumed (see
bert_jax/data_iterator.py), instead of tf.data refusing a saved iterator of
other shapes.
"""

import json
import math
import shutil

import pytest

from tests.helpers.in_process import run_main

pytestmark = pytest.mark.slow


def _train_rows(workdir):
  return [r for r in map(json.loads, open(workdir / "metrics.jsonl"))
          if r["split"] == "train"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
  """6 steps of the tiny run, saved at step 6: the workdir each test resumes
  (a copy of it)."""
  workdir = tmp_path_factory.mktemp("first") / "run"
  first = run_main(workdir, "--config.train.num_steps=6",
                   "--config.train.log_every=1",
                   "--config.checkpoint.save_every_steps=6")
  assert first.returncode == 0, first.stderr[-3000:]
  return workdir


@pytest.mark.parametrize("change", [
    ("--config.train.batch_size=8",),  # 16 -> 8
    ("--config.data.seq_length=64",),  # 32 -> 64 (position table holds 64)
])
def test_resume_after_shape_change(first_run, tmp_path, change):
  workdir = tmp_path / "run"
  shutil.copytree(first_run, workdir)
  second = run_main(workdir, "--config.train.num_steps=10",
                    "--config.train.log_every=1", *change)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "Resumed from checkpoint step 6" in second.stderr
  # 6 steps x 16 rows consumed; the new pipeline skips that many examples.
  new_batch = 8 if "batch_size" in change[0] else 16
  assert (f"examples consumed (96 on process 0), skipping "
          f"{math.ceil(96 / new_batch)} batches") in second.stderr
  rows = _train_rows(workdir)
  assert [r["step"] for r in rows] == list(range(1, 11))
  assert all(math.isfinite(r["loss"]) for r in rows)
  # The new shape really trained (tokens per step follow the new config).
  assert rows[-1]["tokens_per_sec"] > 0


def test_same_shapes_still_resume_exactly_without_skipping(first_run,
                                                           tmp_path):
  workdir = tmp_path / "run"
  shutil.copytree(first_run, workdir)
  again = run_main(workdir, "--config.train.num_steps=8")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "Resumed from checkpoint step 6" in again.stderr
  assert "Data shapes changed" not in again.stderr
