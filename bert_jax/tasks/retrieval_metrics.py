"""Retrieval metrics as ``trec_eval`` computes them, and TREC run files.

A run is, per query, its retrieved documents with their scores, float32
(written in the shortest form that reads back as the same float32, so the
file orders documents as the run does). Every metric reads the run in
``trec_eval``'s order (score descending, ties by document id descending,
as strings), so the numbers here equal ``trec_eval`` (and
``pytrec_eval``) on the written run file:

  ndcg@10     ``ndcg_cut_10``: gains are the qrels relevances, discount
              log2(rank + 1), the ideal from all judged documents
  mrr@10      ``recip_rank`` of the run cut at 10: 1 / the rank of the first
              relevant document (relevance >= 1), 0 past 10
  recall@k    ``recall_k``: relevant documents in the top k / all relevant
  map@100     ``map_cut_100``: precision at each relevant document in the
              top 100, summed, / all relevant

Per-query values are averaged over the judged queries (those in the qrels;
a query without a relevant document scores 0).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

METRICS = ("ndcg@10", "mrr@10", "recall@10", "recall@100", "map@100")


def trec_order(doc_ids: Sequence[str], scores: Sequence[float]) -> list[int]:
  """Positions of `doc_ids` in trec_eval's ranking: score descending, then
  document id descending."""
  scores = np.asarray(scores, np.float32)
  return sorted(range(len(doc_ids)),
                key=lambda i: (-float(scores[i]), _desc(doc_ids[i])))


class _desc(str):
  """A string that sorts in reverse."""

  def __lt__(self, other):
    return str.__gt__(self, other)


def query_metrics(ranked: Sequence[str], judged: Mapping[str, int]
                  ) -> dict[str, float]:
  """The metrics of one query's ranking (document ids, best first) against
  its judgments {doc id: relevance}."""
  rel = np.asarray([max(int(judged.get(d, 0)), 0) for d in ranked],
                   np.float64)
  hit = rel >= 1
  num_rel = sum(1 for v in judged.values() if int(v) >= 1)
  discount = 1.0 / np.log2(np.arange(2, 12))
  dcg = float(np.sum(rel[:10] * discount[:len(rel[:10])]))
  ideal = np.sort(np.asarray([max(int(v), 0) for v in judged.values()],
                             np.float64))[::-1][:10]
  idcg = float(np.sum(ideal * discount[:len(ideal)]))
  first = np.flatnonzero(hit[:10])
  out = {"ndcg@10": dcg / idcg if idcg > 0 else 0.0,
         "mrr@10": 1.0 / (first[0] + 1) if len(first) else 0.0}
  for k in (10, 100):
    out[f"recall@{k}"] = float(np.sum(hit[:k]) / num_rel) if num_rel else 0.0
  ranks = np.flatnonzero(hit[:100]) + 1
  out["map@100"] = float(np.sum(np.arange(1, len(ranks) + 1) / ranks) /
                         num_rel) if num_rel else 0.0
  return out


def evaluate(run: Mapping[str, tuple[Sequence[str], Sequence[float]]],
             qrels: Mapping[str, Mapping[str, int]]
             ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
  """(mean metrics, per query) of `run` {query id: (doc ids, scores)} over
  the judged queries of `qrels`."""
  per_query = {}
  for qid, judged in qrels.items():
    docs, scores = run.get(qid, ((), ()))
    order = trec_order(docs, scores)
    per_query[qid] = query_metrics([docs[i] for i in order], judged)
  means = {m: float(np.mean([q[m] for q in per_query.values()]))
           if per_query else 0.0 for m in METRICS}
  return means, per_query


def run_lines(run: Mapping[str, tuple[Sequence[str], Sequence[float]]],
              tag: str = "bert_jax"):
  """The run as TREC lines, ``qid Q0 docid rank score tag``, in trec_eval's
  order within each query."""
  for qid, (docs, scores) in run.items():
    for rank, i in enumerate(trec_order(docs, scores), 1):
      yield f"{qid} Q0 {docs[i]} {rank} {np.float32(scores[i])} {tag}\n"


def write_run(path: str, run, tag: str = "bert_jax") -> None:
  """A TREC run file of `run` (see :func:`run_lines`)."""
  with open(path, "w") as f:
    f.writelines(run_lines(run, tag))
