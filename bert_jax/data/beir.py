"""BEIR-format retrieval data: ``corpus.jsonl``, ``queries.jsonl``,
``qrels/<split>.tsv``.

  corpus.jsonl    {"_id": ..., "title": ..., "text": ...} per line; a
                  document is embedded as ``title + " " + text``, stripped
                  (as BEIR's own sentence-transformers wrapper does)
  queries.jsonl   {"_id": ..., "text": ...} per line
  qrels/S.tsv     a header, then query-id, corpus-id, relevance (an integer)

:func:`read` checks everything before anything is embedded or written: a
missing file, a malformed line, a duplicate id, an empty query, a qrels
line naming a query or a document that is not there: one ValueError naming
the file and line. The corpus is read twice and streamed
(:func:`corpus_chunks`), never held whole: only its ids stay in memory.
"""

from __future__ import annotations

import dataclasses
import os

from bert_jax.data import task_sources

CORPUS, QUERIES, QRELS_DIR = "corpus.jsonl", "queries.jsonl", "qrels"


@dataclasses.dataclass
class Retrieval:
  """A BEIR directory's queries (those the qrels judge) and judgments; the
  corpus stays on disk (:func:`corpus_chunks`)."""
  directory: str
  split: str
  query_ids: list[str]
  queries: list[str]
  qrels: dict[str, dict[str, int]]  # query id -> {doc id: relevance}
  corpus_ids: list[str]

  def __len__(self):
    return len(self.corpus_ids)


def _open(path: str):
  """A BEIR file; a missing one is named with what the directory holds."""
  return task_sources.open_file(
      path, f"a BEIR directory holds {CORPUS}, {QUERIES} and "
      f"{QRELS_DIR}/<split>.tsv")


def _jsonl(path: str):
  """(line number, object) per non-blank line; ValueError naming the line
  for anything that is not an object with a string "_id"."""
  with _open(path) as f:
    lines = (raw.decode("utf-8-sig" if n == 0 else "utf-8")
             for n, raw in enumerate(f))
    for n, obj in task_sources.json_lines(path, lines):
      if not isinstance(obj, dict) or "_id" not in obj:
        raise ValueError(f"{path}:{n}: not an object with an \"_id\".")
      yield n, obj


def _doc_text(obj: dict) -> str:
  return (str(obj.get("title") or "") + " " +
          str(obj.get("text") or "")).strip()


def corpus_chunks(directory: str, size: int):
  """Lists of (doc ids, texts), `size` documents at a time, in file order."""
  ids, texts = [], []
  for _, obj in _jsonl(os.path.join(directory, CORPUS)):
    ids.append(str(obj["_id"]))
    texts.append(_doc_text(obj))
    if len(ids) == size:
      yield ids, texts
      ids, texts = [], []
  if ids:
    yield ids, texts


def read_corpus(directory: str) -> tuple[list[str], list[str]]:
  """(doc ids, texts) of the whole corpus, in memory (evaluation during
  fine-tuning; the standalone evaluator streams :func:`corpus_chunks`)."""
  ids, texts = [], []
  for i, t in corpus_chunks(directory, 1 << 16):
    ids += i
    texts += t
  return ids, texts


def _qrels(path: str) -> list[tuple[int, str, str, int]]:
  with _open(path) as f:
    lines = f.read().decode("utf-8-sig").split("\n")
  out = []
  for n, line in enumerate(lines, 1):
    if n == 1 or not line.strip():  # The header.
      continue
    cells = line.rstrip("\r").split("\t")
    if len(cells) != 3:
      raise ValueError(f"{path}:{n}: {len(cells)} tab-separated cells, "
                       "expected query-id, corpus-id, score.")
    try:
      rel = int(cells[2])
    except ValueError:
      raise ValueError(f"{path}:{n}: score {cells[2]!r} is not an "
                       "integer.") from None
    out.append((n, cells[0], cells[1], rel))
  return out


def read(directory: str, split: str) -> Retrieval:
  """The judged queries, their qrels and the corpus ids of `directory`;
  ValueError naming the file and line for anything inconsistent."""
  qrels_path = os.path.join(directory, QRELS_DIR, f"{split}.tsv")
  judged = _qrels(qrels_path)
  if not judged:
    raise ValueError(f"{qrels_path} judges nothing.")
  queries_path = os.path.join(directory, QUERIES)
  queries = {}
  for n, obj in _jsonl(queries_path):
    qid = str(obj["_id"])
    if qid in queries:
      raise ValueError(f"{queries_path}:{n}: query id {qid!r} again.")
    queries[qid] = (n, str(obj.get("text") or ""))
  corpus_path = os.path.join(directory, CORPUS)
  corpus_ids, seen = [], set()
  for n, obj in _jsonl(corpus_path):
    did = str(obj["_id"])
    if did in seen:
      raise ValueError(f"{corpus_path}:{n}: document id {did!r} again.")
    seen.add(did)
    corpus_ids.append(did)
  qrels: dict[str, dict[str, int]] = {}
  for n, qid, did, rel in judged:
    if qid not in queries:
      raise ValueError(f"{qrels_path}:{n}: query {qid!r} is not in "
                       f"{queries_path}.")
    if did not in seen:
      raise ValueError(f"{qrels_path}:{n}: document {did!r} is not in "
                       f"{corpus_path}.")
    qrels.setdefault(qid, {})[did] = rel
  ids = [q for q in queries if q in qrels]
  for qid in ids:
    if not queries[qid][1].strip():
      raise ValueError(f"{queries_path}:{queries[qid][0]}: query {qid!r} has "
                       "an empty text.")
  return Retrieval(directory, split, ids, [queries[q][1] for q in ids], qrels,
                   corpus_ids)
