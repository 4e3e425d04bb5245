"""The pairs kind end to end: ``bert_jax.finetune`` with configs/pairs.py.

A tiny random encoder on MiniLM's vocabulary (a sentence-transformers
directory) trains on real MRPC paraphrases with in-batch negatives; every
evaluation scores the MRPC dev pairs (paraphrase detection at the best
threshold) and BEIR files made of them (retrieval), into results.json,
metrics.jsonl and TensorBoard; the predictions are each pair's similarity
and a TREC run file whose trec_eval numbers are the reported ones; the
export loads in SentenceTransformer with the run's vectors. Its texts are
packed into rows (configs/pairs.py); the same run on padded texts logs the
same losses, scores and similarities. A run killed with SIGKILL resumes exactly; bad pair
files and BEIR files, and a run with nothing to score, are one line before
anything is written.
"""

import json
import os
import shutil

import numpy as np
import pytest

from bert_jax.downstream import finetuning
from bert_jax.downstream import sentence_embeddings
from tests import helpers
from tests.helpers import in_process
from tests.helpers import tiny_models

DATA = os.path.join(helpers.REPO, "tests", "data_files")
MRPC = dict(text_field="#1 String", text_pair_field="#2 String",
            label_field="Quality", score_range=(0.0, 1.0))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  base = str(tmp_path_factory.mktemp("pairs_ft"))
  return dict(base=base, init=tiny_models.make_embedding_dir(base),
              beir=tiny_models.write_beir_from_pairs(
                  os.path.join(base, "beir"),
                  os.path.join(DATA, "mrpc_dev.tsv"), "#1 String",
                  "#2 String", "Quality"))


def _config(setup, **task):
  config = helpers.load_config("pairs")
  config.task.update(name="mrpc_pairs",
                     train_file=os.path.join(DATA, "mrpc_train.tsv"),
                     validation_file=os.path.join(DATA, "mrpc_dev.tsv"),
                     retrieval_dir=setup["beir"], buckets=(32, 64), **MRPC)
  config.task.update(task)
  config.data.seq_length = 64
  config.train.update(init_from=setup["init"], batch_size=16, num_steps=12,
                      learning_rate=1e-3, warmup_steps=2, log_every=4,
                      eval_every=6)
  # No dropout: the packed run draws its masks over other shapes.
  config.model.update(helpers.NO_DROPOUT)
  config.checkpoint.async_save = False
  return config


def _run(setup, name, **data):
  workdir = os.path.join(setup["base"], name)
  config = _config(setup)
  config.data.update(data)
  return dict(workdir=workdir, results=finetuning.run(config, workdir))


@pytest.fixture(scope="module")
def finished(setup):
  return _run(setup, "run", packing=True, packing_max_sequences=4)


@pytest.fixture(scope="module")
def padded(setup):
  return _run(setup, "padded", packing=False)


def test_a_run_scores_pairs_and_retrieval_at_every_evaluation(finished):
  results, workdir = finished["results"], finished["workdir"]
  assert results["kind"] == "pairs"
  scores = results["scores"]
  assert set(scores) == {"validation", "retrieval"}
  assert {"accuracy", "f1", "average_precision"} <= set(scores["validation"])
  assert set(scores["retrieval"]) == {"ndcg@10", "mrr@10", "recall@10",
                                      "recall@100", "map@100"}
  assert 0 < scores["retrieval"]["ndcg@10"] <= 1
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals = [json.loads(l) for l in f if '"eval"' in l]
  assert [r["step"] for r in evals] == [6, 12]
  assert all("retrieval/ndcg@10" in r and "validation/average_precision" in r
             for r in evals)
  assert any(f.startswith("events.out.tfevents") for _, _, fs in
             os.walk(workdir) for f in fs)


def test_predictions_are_similarities_and_a_trec_run(finished, setup):
  pytrec_eval = pytest.importorskip("pytrec_eval")
  from bert_jax.data import beir
  workdir, results = finished["workdir"], finished["results"]
  with open(os.path.join(workdir, "predictions", "validation",
                         "predictions.jsonl")) as f:
    pairs = [json.loads(l) for l in f]
  assert len(pairs) == 200 and all(-1 <= p["similarity"] <= 1 for p in pairs)
  assert pairs[0]["where"].endswith("mrpc_dev.tsv:2")
  run = {}
  with open(os.path.join(workdir, "predictions", "retrieval",
                         "run.trec")) as f:
    for line in f:
      qid, _, doc, _, score, _ = line.split()
      run.setdefault(qid, {})[doc] = float(score)
  qrels = beir.read(setup["beir"], "test").qrels
  assert set(run) == set(qrels) and all(len(d) == 100 for d in run.values())
  theirs = pytrec_eval.RelevanceEvaluator(
      qrels, {"ndcg_cut_10", "recall_100"}).evaluate(run)
  for ours, trec in (("ndcg@10", "ndcg_cut_10"), ("recall@100",
                                                  "recall_100")):
    mean = np.mean([theirs[q][trec] for q in qrels])
    assert abs(results["scores"]["retrieval"][ours] - mean) < 1e-9


def _logged(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(l) for l in f]


def _similarities(workdir):
  with open(os.path.join(workdir, "predictions", "validation",
                         "predictions.jsonl")) as f:
    return [json.loads(l)["similarity"] for l in f]


@pytest.mark.slow  # A second whole run, padded.
def test_packed_rows_train_and_score_as_padded_texts(finished, padded):
  packed = finished  # configs/pairs.py packs.
  ours, theirs = _logged(packed["workdir"]), _logged(padded["workdir"])
  assert [r["step"] for r in ours] == [r["step"] for r in theirs]
  losses = [(a["loss"], b["loss"]) for a, b in zip(ours, theirs)
            if "loss" in a]
  assert len(losses) >= 3
  np.testing.assert_allclose(*zip(*losses), rtol=1e-4)
  for split, scores in padded["results"]["scores"].items():
    for name, value in scores.items():
      assert abs(packed["results"]["scores"][split][name] - value) < 1e-4, (
          split, name)
  np.testing.assert_allclose(_similarities(packed["workdir"]),
                             _similarities(padded["workdir"]), atol=1e-4)


def test_the_export_loads_in_sentence_transformers(finished, tmp_path):
  st = pytest.importorskip("sentence_transformers")
  out = str(tmp_path / "export")
  proc = in_process.run_module("to_hf", "--workdir", finished["workdir"],
                               "--output", out)
  assert proc.returncode == 0, proc.stderr[-3000:]
  sentences = ["The company said it would cut 500 jobs.",
               "Shares rose 3 percent in early trading.", ""]
  theirs = st.SentenceTransformer(out, device="cpu").encode(
      sentences, convert_to_numpy=True)
  ours = sentence_embeddings.load(finished["workdir"]).encode(sentences)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)


# -----------------------------------------------------------------------------
# kill -9, then the same command: the same losses, bit for bit (packed
# rows: the iterator's position resumes, packing is a function of a batch).
# -----------------------------------------------------------------------------
def _flags(setup, workdir, steps):
  c = _config(setup)
  t = c.task
  return ["--config", os.path.join(helpers.REPO, "configs", "pairs.py"),
          "--workdir", workdir, f"--config.task.name={t.name}",
          f"--config.task.train_file={t.train_file}",
          f"--config.task.validation_file={t.validation_file}",
          f"--config.task.text_field={t.text_field}",
          f"--config.task.text_pair_field={t.text_pair_field}",
          f"--config.task.label_field={t.label_field}",
          "--config.task.score_range=(0.0, 1.0)",
          "--config.task.buckets=(32, 64)", "--config.data.seq_length=64",
          f"--config.train.init_from={setup['init']}",
          "--config.train.batch_size=16", "--config.train.learning_rate=1e-3",
          f"--config.train.num_steps={steps}", "--config.train.log_every=1",
          "--config.train.eval_every=1000", "--config.data.packing=True",
          "--config.data.packing_max_sequences=4",
          "--config.checkpoint.save_every_steps=5",
          "--config.checkpoint.async_save=False"]


@pytest.mark.slow
def test_a_killed_run_resumes_exactly(setup):
  workdir = os.path.join(setup["base"], "killed")
  helpers.assert_resumes_exactly_after_kill9(
      "finetune", _flags(setup, workdir, 14), workdir, kill_after=7,
      save_every=5, num_steps=14)


# -----------------------------------------------------------------------------
# Bad input: one line naming the file (and line), nothing written.
# -----------------------------------------------------------------------------
def _bad_copy(src, dst, edit):
  with open(src) as f:
    lines = f.read().split("\n")
  with open(dst, "w") as f:
    f.write("\n".join(edit(lines)))
  return dst


def _cut_cell(lines, row, col):
  cells = lines[row].split("\t")
  cells[col] = ""
  return lines[:row] + ["\t".join(cells)] + lines[row + 1:]


@pytest.mark.parametrize("case", ["missing_column", "empty_text",
                                  "score_out_of_range", "qrels_unknown_doc",
                                  "nothing_to_score"])
def test_bad_input_is_one_line_before_anything_is_written(setup, tmp_path,
                                                          case):
  train = os.path.join(DATA, "mrpc_train.tsv")
  bad = str(tmp_path / "bad.tsv")
  config = _config(setup)
  if case == "missing_column":
    config.task.text_pair_field = "#3 String"
    want = f"{train}: no column '#3 String' in its header"
  elif case == "empty_text":
    config.task.train_file = _bad_copy(train, bad,
                                       lambda l: _cut_cell(l, 7, 4))
    want = f"{bad}:8: empty text in '#2 String'."
  elif case == "score_out_of_range":
    config.task.train_file = _bad_copy(
        train, bad, lambda l: l[:3] + ["2" + l[3][1:]] + l[4:])
    want = f"{bad}:4: Quality=2 is outside task.score_range=(0.0, 1.0)."
  elif case == "nothing_to_score":
    config.task.update(validation_file="", retrieval_dir="")
    want = "Nothing to score the sentence space on: set task.validation_file"
  else:
    beir_dir = str(tmp_path / "beir")
    shutil.copytree(setup["beir"], beir_dir)
    qrels = os.path.join(beir_dir, "qrels", "test.tsv")
    with open(qrels, "a") as f:
      f.write("q0\tnot_a_doc\t1\n")
    n = sum(1 for _ in open(qrels))
    config.task.retrieval_dir = beir_dir
    want = (f"{qrels}:{n}: document 'not_a_doc' is not in "
            f"{beir_dir}/corpus.jsonl.")
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(workdir))
  assert str(e.value).startswith(want), e.value
  assert "\n" not in str(e.value)
  assert not workdir.exists()
