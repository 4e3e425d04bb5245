"""Retrieval metrics equal trec_eval's (pytrec_eval-terrier) on the run
file we write: random runs with tied scores, graded judgments, queries
without a relevant document and documents never judged."""

import numpy as np
import pytest

from bert_jax.tasks import retrieval_metrics

pytrec_eval = pytest.importorskip("pytrec_eval")

MEASURES = {"ndcg@10": "ndcg_cut_10", "recall@10": "recall_10",
            "recall@100": "recall_100", "map@100": "map_cut_100"}


def _case(seed):
  r = np.random.RandomState(seed)
  docs = [f"doc{i}" for i in range(400)]
  qrels = {f"q{q}": {docs[j]: int(r.randint(0, 3))
                     for j in r.choice(400, r.randint(1, 12), replace=False)}
           for q in range(60)}
  qrels["q_unjudged_relevant"] = {docs[0]: 0}
  run = {}
  for q in qrels:
    idx = r.choice(400, 150, replace=False)
    scores = np.round(r.uniform(0, 1, 150), 2).astype(np.float32)  # ties
    run[q] = ([docs[i] for i in idx], scores)
  return run, qrels


def _read_run(path):
  out = {}
  with open(path) as f:
    for line in f:
      qid, q0, doc, rank, score, tag = line.split()
      assert q0 == "Q0" and tag == "bert_jax" and int(rank) >= 1
      out.setdefault(qid, {})[doc] = float(score)
  return out


@pytest.mark.parametrize("seed", [0, 1])
def test_metrics_equal_trec_eval_on_the_written_run_file(tmp_path, seed):
  run, qrels = _case(seed)
  path = str(tmp_path / "run.trec")
  retrieval_metrics.write_run(path, run)
  written = _read_run(path)
  theirs = pytrec_eval.RelevanceEvaluator(
      qrels, set(MEASURES.values())).evaluate(written)
  # MRR@10 is trec_eval's recip_rank of the run cut at 10.
  top10 = {q: dict(sorted(d.items(), key=lambda kv: (
      -kv[1], retrieval_metrics._desc(kv[0])))[:10])
           for q, d in written.items()}
  theirs_rr = pytrec_eval.RelevanceEvaluator(
      qrels, {"recip_rank"}).evaluate(top10)
  means, per_query = retrieval_metrics.evaluate(run, qrels)
  assert set(per_query) == set(theirs) == set(qrels)
  for q in qrels:
    for ours, trec in MEASURES.items():
      assert abs(per_query[q][ours] - theirs[q][trec]) < 1e-12, (q, ours)
    assert abs(per_query[q]["mrr@10"] - theirs_rr[q]["recip_rank"]) < 1e-12
  for ours, trec in MEASURES.items():
    assert abs(means[ours] - np.mean([theirs[q][trec] for q in qrels])) < (
        1e-12)
  assert 0 < means["ndcg@10"] < 1 and 0 < means["recall@100"] < 1


def test_the_file_orders_documents_as_trec_eval_does(tmp_path):
  """Ties by document id, descending; ranks 1.. in that order."""
  run = {"q": (["a", "c", "b", "d"],
               np.asarray([0.5, 0.5, 0.5, 0.9], np.float32))}
  lines = list(retrieval_metrics.run_lines(run))
  assert [l.split()[2] for l in lines] == ["d", "c", "b", "a"]
  assert [l.split()[3] for l in lines] == ["1", "2", "3", "4"]
