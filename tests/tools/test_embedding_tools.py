"""tools/bench_embeddings.py and tools/pairs_reference.py run end to end at
tiny shapes (a 2x64 encoder on MiniLM's vocabulary, real MRPC / STS-B
slices): every side reports, the cached and packed steps' memory is below
the plain one's, and both implementations score the same start identically
(our Spearman and sentence-transformers' evaluator on the same model). No
speed or quality is judged here: that is for a quiet machine."""

import json
import os

import pytest

from tests import helpers
from tests.helpers import tiny_models

DATA = os.path.join(helpers.REPO, "tests", "data_files")
pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return tiny_models.make_embedding_dir(str(tmp_path_factory.mktemp("m")))


@pytest.mark.slow
def test_bench_embeddings_reports_every_side(model_dir, tmp_path):
  out = str(tmp_path / "bench.json")
  res = helpers.run_tool(
      "bench_embeddings.py", "--config",
      os.path.join(helpers.REPO, "configs", "pairs.py"),
      f"--config.train.init_from={model_dir}",
      f"--config.task.train_file={DATA}/mrpc_train.tsv",
      f"--config.task.validation_file={DATA}/mrpc_dev.tsv",
      "--config.task.text_field=#1 String",
      "--config.task.text_pair_field=#2 String",
      "--config.task.label_field=Quality",
      "--config.task.score_range=(0.0, 1.0)",
      "--config.train.batch_size=16", "--config.data.seq_length=64",
      "--encode_sentences=64", "--rounds=1", "--steps=2", "--warmup=1",
      "--chunk=4", f"--json={out}", timeout=1800)
  assert res.returncode == 0, res.stderr[-3000:]
  with open(out) as f:
    r = json.load(f)
  assert [s["side"] for s in r["results"]] == [
      "bert_jax packed", "sentence-transformers encode",
      "bert_jax train step", "bert_jax train step, packed rows",
      "bert_jax cached (chunks of 4)", "sentence-transformers trainer"]
  assert all(v > 0 for s in r["results"] for k, v in s.items()
             if k != "side")
  m = r["memory"]
  assert m["cached"]["temporaries_mb"] < m["plain"]["temporaries_mb"]
  # A packed row per example instead of K padded texts.
  assert m["packed"]["temporaries_mb"] < m["plain"]["temporaries_mb"]
  assert "encode: bert_jax / sentence-transformers" in res.stdout


@pytest.mark.slow
def test_pairs_reference_trains_both_and_scores_the_start_alike(model_dir,
                                                                tmp_path):
  workdir = str(tmp_path / "ref")
  res = helpers.run_tool(
      "pairs_reference.py", "--config",
      os.path.join(helpers.REPO, "configs", "pairs.py"),
      f"--config.train.init_from={model_dir}", "--workdir", workdir,
      "--config.objective.pair_loss=cosent",
      f"--config.task.train_file={DATA}/stsb_train.tsv",
      f"--config.task.validation_file={DATA}/stsb_dev.tsv",
      "--config.train.batch_size=16", "--config.train.num_steps=3",
      "--config.data.seq_length=64", timeout=1800)
  assert res.returncode == 0, res.stderr[-3000:]
  with open(os.path.join(workdir, "reference.json")) as f:
    r = json.load(f)
  s = r["spearman"]
  assert abs(s["ours_before"] - s["theirs_before"]) < 1e-4, s
  assert r["steps"] == 3 and "difference after" in res.stdout
  assert os.path.isdir(os.path.join(workdir, "ours", "checkpoints"))
