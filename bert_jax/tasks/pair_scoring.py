"""The pairs kind's input and evaluation: batches of every split, and the
vectors of the eval splits scored.

Every eval split is a list of distinct texts in batches (``data/
pair_batches``): a pair split's rows are its pairs (their loss is the eval
loss), the retrieval split's rows hold its queries and documents two to a
row. The predict step returns each slot's vector; :class:`Scorer` puts
them back in text order and scores the split:

  sts        Spearman / Pearson of the pairs' cosines vs their scores
  binary     accuracy / F1 / AP at the best cosine threshold (0 / 1 labels)
  retrieval  exact top-k of every query over the corpus by cosine, in
             chunks of documents, scored as trec_eval does

Predictions: ``predictions/<split>/predictions.jsonl`` (per pair its source
row, texts, score and similarity) and ``predictions/retrieval/run.trec``
(per query its ranked documents, a TREC run file).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np

from bert_jax.data import beir
from bert_jax.data import feature_batches
from bert_jax.data import pair_batches
from bert_jax.tasks import pair_metrics
from bert_jax.tasks import retrieval_metrics

STS, BINARY, RETRIEVAL = "sts", "binary", "retrieval"
PREDICTIONS_FILE = "predictions.jsonl"
RUN_FILE = "run.trec"
_ENCODE_CHUNK = 4096


def tf_encoder(tok):
  """list of str -> list of piece-id arrays, by the run's tokenizer (its
  in-graph op, run eagerly)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def encode(texts):
    out = []
    for lo in range(0, len(texts), _ENCODE_CHUNK):
      ids = tok.tokenize(tf.constant(list(texts[lo:lo + _ENCODE_CHUNK]),
                                     tf.string))
      flat, splits = ids.flat_values.numpy(), ids.row_splits.numpy()
      out += [flat[a:b] for a, b in zip(splits[:-1], splits[1:])]
    return out

  return encode


class Split:
  """One eval split: its distinct texts, what they are, how to score."""

  def __init__(self, metric: str, texts: pair_batches.Texts, *,
               pairs=None, scores=None, where=(), retrieval=None):
    self.metric, self.texts = metric, texts
    self.pairs, self.scores, self.where = pairs, scores, list(where)
    self.retrieval = retrieval

  def __len__(self):
    return len(self.pairs) if self.pairs is not None else len(
        self.retrieval.query_ids)


class Input:
  """Train iterator (resumable) and per-split eval batches."""

  def __init__(self, config, tok, task, train, evals: dict,
               encode=None):
    if tok.cls_id is None or tok.sep_id is None:
      raise ValueError(f"Tokenizer {tok.path!r} has no [CLS] / [SEP].")
    seq = int(config.data.seq_length)
    encode = encode or tf_encoder(tok)
    wrap = lambda strings: pair_batches.encode_texts(
        strings, encode, tok.cls_id, tok.sep_id, seq)
    lengths = feature_batches.bucket_lengths(seq, tuple(config.task.buckets))
    proc = dict(process_index=jax.process_index(),
                process_count=jax.process_count())
    pad = 0 if tok.pad_id is None else int(tok.pad_id)
    packing = train_packing = None
    if config.data.get("packing", False):
      packing = pair_batches.Packing(
          pair_batches.row_lengths_for(lengths, len(task.columns)),
          int(config.data.packing_max_sequences))
      chunk = int(config.train.get("cache_chunk_size", 0))
      # The cached step embeds its chunks apart: each packed on its own.
      train_packing = dataclasses.replace(
          packing, chunks=config.train.batch_size // chunk if chunk else 1)
    strings, index = pair_batches.distinct(train.texts)
    scores = (train.scores if train.scores is not None else
              np.zeros(len(train), np.float32))
    self.num_train = len(train)
    self.train_iter = pair_batches.PairIterator(
        wrap(strings), index, scores, batch_size=config.train.batch_size,
        seed=config.train.seed, lengths=lengths, pad_id=pad,
        packing=train_packing, **proc)
    kw = dict(batch_size=config.train.batch_size, lengths=lengths,
              pad_id=pad, packing=packing, **proc)
    infonce = config.objective.pair_loss == "infonce"
    threshold = float(config.task.get("positive_threshold", 0.5))
    self.data, self.eval_splits = {}, {}
    for split, rows in evals.items():
      metric = task.metrics[split]
      if metric == RETRIEVAL:
        doc_ids, docs = beir.read_corpus(rows.directory)
        texts = wrap(list(rows.queries) + docs)
        _check_same_corpus(rows, doc_ids)
        self.data[split] = Split(metric, texts, retrieval=rows)
        self.eval_splits[split] = pair_batches.eval_texts(texts, **kw)
        continue
      strings, index = pair_batches.distinct(rows.texts)
      weights = (rows.scores >= threshold if infonce else
                 np.ones(len(rows), bool)).astype(np.float32)
      texts = wrap(strings)
      self.data[split] = Split(metric, texts, pairs=index,
                               scores=rows.scores, where=rows.where)
      self.eval_splits[split] = pair_batches.eval_pairs(
          texts, index, rows.scores, weights, **kw)
    self.eval_batches = [b for bs in self.eval_splits.values() for b in bs]

  def eval_extras(self) -> dict:
    return {}


def _check_same_corpus(rows: beir.Retrieval, doc_ids) -> None:
  """The corpus read for its texts is the one the checks read."""
  if list(doc_ids) != list(rows.corpus_ids):
    raise ValueError(f"{rows.directory}/{beir.CORPUS} changed while it was "
                     "read.")


def main_score(scores: dict) -> float:
  """Spearman (STS), average precision (paraphrase pairs) or nDCG@10."""
  for key in ("spearman", "average_precision", "ndcg@10"):
    if key in scores:
      return float(scores[key])
  raise ValueError(f"No main score among {sorted(scores)}.")


def search(queries: np.ndarray, docs: np.ndarray, k: int,
           chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
  """Exact top-k documents of every query by cosine, over chunks of
  documents: (indices [Q, k'], similarities [Q, k'], best first; k' =
  min(k, documents))."""
  q = _unit(queries)
  best_s = np.full((len(q), 0), -np.inf, np.float32)
  best_i = np.zeros((len(q), 0), np.int64)
  for lo in range(0, len(docs), chunk):
    s = q @ _unit(docs[lo:lo + chunk]).T
    cand_s = np.concatenate([best_s, s], axis=1)
    cand_i = np.concatenate(
        [best_i, np.broadcast_to(np.arange(lo, lo + s.shape[1]), s.shape)],
        axis=1)
    keep = min(k, cand_s.shape[1])
    top = np.argsort(-cand_s, axis=1, kind="stable")[:, :keep]
    best_s = np.take_along_axis(cand_s, top, 1)
    best_i = np.take_along_axis(cand_i, top, 1)
  return best_i, best_s


def _unit(x) -> np.ndarray:
  """float32 rows divided by their L2 norm (at least 1e-12)."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class Scorer:
  """Per eval split: the texts' vectors -> its scores and predictions."""

  def __init__(self, task, task_input: Input, config):
    self.task, self.input = task, task_input
    self.k = int(config.task.get("retrieval_k", 100))
    self.predicted: dict = {}
    self.details: dict = {}

  def vectors(self, split: str, batches: list) -> np.ndarray:
    """[texts, d]: each text's vector from `batches` [(text index [n],
    {"embeddings": [n, d]})] (slots of -1 are empty)."""
    data = self.input.data[split]
    out = None
    seen = np.zeros(len(data.texts), bool)
    for index, o in batches:
      index, v = np.asarray(index).reshape(-1), np.asarray(o["embeddings"])
      v = v.reshape(len(index), -1)
      if out is None:
        out = np.zeros((len(data.texts), v.shape[-1]), np.float32)
      real = index >= 0
      out[index[real]] = v[real]
      seen[index[real]] = True
    if out is None or not seen.all():
      raise AssertionError(f"{int((~seen).sum())} texts of {split} got no "
                           "vector.")
    return out

  def score(self, split: str, batches: list) -> dict:
    data = self.input.data[split]
    vec = self.vectors(split, batches)
    if data.metric == RETRIEVAL:
      r = data.retrieval
      nq = len(r.query_ids)
      idx, sim = search(vec[:nq], vec[nq:], self.k)
      run = {qid: ([r.corpus_ids[j] for j in idx[i]], sim[i])
             for i, qid in enumerate(r.query_ids)}
      means, per_query = retrieval_metrics.evaluate(run, r.qrels)
      self.predicted[split] = run
      self.details[split] = dict(queries=nq, documents=len(r.corpus_ids),
                                 per_query=per_query)
      return means
    sim = pair_metrics.cosine(vec[data.pairs[:, 0]], vec[data.pairs[:, 1]])
    self.predicted[split] = sim
    self.details[split] = dict(pairs=int(len(sim)))
    if data.metric == STS:
      return pair_metrics.sts(sim, data.scores)
    return pair_metrics.binary(sim, data.scores)

  def write(self, directory: str) -> list[str]:
    """predictions/<split>/predictions.jsonl, or run.trec for retrieval."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (gs://)
    paths = []
    for split, predicted in self.predicted.items():
      data = self.input.data[split]
      d = os.path.join(directory, split)
      tf.io.gfile.makedirs(d)
      if data.metric == RETRIEVAL:
        path = os.path.join(d, RUN_FILE)
        with tf.io.gfile.GFile(path, "w") as f:
          for line in retrieval_metrics.run_lines(predicted):
            f.write(line)
      else:
        path = os.path.join(d, PREDICTIONS_FILE)
        strings = data.texts.strings
        with tf.io.gfile.GFile(path, "w") as f:
          for i, (a, b) in enumerate(data.pairs):
            f.write(json.dumps(dict(
                where=data.where[i], text=strings[a], text_pair=strings[b],
                score=float(data.scores[i]), similarity=float(predicted[i])),
                ensure_ascii=False) + "\n")
      paths.append(path)
    return paths
