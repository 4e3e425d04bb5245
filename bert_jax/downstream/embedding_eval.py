"""A sentence space scored on its own: STS pairs, paraphrase pairs and BEIR
retrieval for any model path (``python -m bert_jax.evaluate_embeddings``).

The vectors are ``sentence_embeddings``' (packed rows, the model's own
pooling); the metrics are the pairs kind's (``tasks/pair_metrics``,
``tasks/retrieval_metrics``), so a number here and one logged during
fine-tuning mean the same. Retrieval is exact: the queries' vectors stay,
the corpus is read, embedded and searched chunk by chunk
(:class:`TopK`: each chunk's cosines with every query, merged into the
running top k on the devices), so memory is a chunk's and the top-k lists,
whatever the corpus size. Every input is checked (``data/pair_sources``,
``data/beir``) before anything is embedded or written.
"""

from __future__ import annotations

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.data import beir
from bert_jax.data import pair_sources
from bert_jax.tasks import pair_metrics
from bert_jax.tasks import retrieval_metrics

CORPUS_CHUNK = 16384  # Documents embedded and searched together.


@functools.partial(jax.jit, static_argnames="k")
def _merge(queries, docs, offset, best_scores, best_index, *, k: int):
  """The running top-k (scores, document index) with one chunk merged."""
  unit = lambda x: x / jnp.maximum(
      jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  scores = unit(queries) @ unit(docs).T  # [Q, C]
  index = offset + jnp.arange(docs.shape[0], dtype=jnp.int32)
  scores = jnp.concatenate([best_scores, scores], axis=1)
  index = jnp.concatenate(
      [best_index, jnp.broadcast_to(index, (queries.shape[0],
                                            docs.shape[0]))], axis=1)
  top, where = jax.lax.top_k(scores, k)
  return top, jnp.take_along_axis(index, where, axis=1)


class TopK:
  """Exact top-k documents by cosine for fixed queries, over documents
  given chunk by chunk (the arrays stay on the devices)."""

  def __init__(self, queries: np.ndarray, k: int):
    self.queries = jnp.asarray(queries, jnp.float32)
    self.k, self.seen = int(k), 0
    q = self.queries.shape[0]
    self.scores = jnp.full((q, self.k), -jnp.inf, jnp.float32)
    self.index = jnp.full((q, self.k), -1, jnp.int32)

  def add(self, docs: np.ndarray) -> None:
    self.scores, self.index = _merge(
        self.queries, jnp.asarray(docs, jnp.float32), self.seen,
        self.scores, self.index, k=self.k)
    self.seen += len(docs)

  def result(self) -> tuple[np.ndarray, np.ndarray]:
    """(document index [Q, k'], cosine [Q, k']) best first; k' = min(k,
    documents seen)."""
    kept = min(self.k, self.seen)
    return (np.asarray(self.index)[:, :kept],
            np.asarray(self.scores)[:, :kept])


def score_pairs(embedder, rows: pair_sources.PairRows, metric: str = ""
                ) -> dict:
  """STS (graded scores) or paraphrase (0 / 1 labels; `metric` forces one)
  scores of `rows`' (first, second) texts."""
  binary = bool(np.all(np.isin(rows.scores, (0.0, 1.0))))
  metric = metric or ("binary" if binary else "sts")
  sim = pair_metrics.cosine(embedder.encode(list(rows.texts[0])),
                            embedder.encode(list(rows.texts[1])))
  if metric == "sts":
    return pair_metrics.sts(sim, rows.scores)
  return pair_metrics.binary(sim, rows.scores)


def evaluate_retrieval(embedder, retrieval: beir.Retrieval, k: int = 100,
                       run_path: str = "") -> tuple[dict, dict]:
  """(mean metrics, per query) of exact top-`k` retrieval over the corpus,
  streamed; the run written to `run_path` (a TREC run file) when given."""
  top = TopK(embedder.encode(retrieval.queries), k)
  doc_ids = []
  for ids, texts in beir.corpus_chunks(retrieval.directory, CORPUS_CHUNK):
    top.add(embedder.encode(texts))
    doc_ids += ids
  if doc_ids != retrieval.corpus_ids:
    raise ValueError(f"{retrieval.directory}/{beir.CORPUS} changed while it "
                     "was read.")
  index, scores = top.result()
  run = {q: ([doc_ids[j] for j in index[i]], scores[i])
         for i, q in enumerate(retrieval.query_ids)}
  if run_path:
    retrieval_metrics.write_run(run_path, run)
  return retrieval_metrics.evaluate(run, retrieval.qrels)


def write_results(path: str, results: dict) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(results, f, indent=1)
