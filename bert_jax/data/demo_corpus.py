"""A small real-English demo corpus that is present on every machine.

CPython ships its documentation topics as text (``pydoc_data.topics``: 79
topics, ~465 KB). :func:`write_demo_corpus` writes them in the
google-research/bert layout: one sentence per line, a blank line between
documents, one topic = one document. Every ``EVAL_EVERY``-th topic (sorted by
name) goes to the held-out file, the rest to ``NUM_TRAIN_FILES`` train files
(several files so per-host file sharding has something to shard).
"""

import os
import re
import uuid
from pydoc_data import topics

import numpy as np
import tensorflow as tf
from absl import logging

NUM_TRAIN_FILES = 4
EVAL_EVERY = 10  # topics 0, 10, 20, ... -> 8 held-out documents
_VERSION = "v1"

# End of sentence: . ! ? (optionally closing quote/bracket), whitespace, then
# an upper-case letter, a digit or an opening quote/bracket.
_SENT_END = re.compile(r"(?<=[.!?])([\"')\]]?)\s+(?=[A-Z0-9\"'(\[])")


def split_sentences(text: str) -> list[str]:
  """Splits one document into sentences (or code lines), dropping blank ones."""
  out = []
  for para in re.split(r"\n\s*\n", text):
    lines = [l for l in para.split("\n")
             if l.strip() and not re.fullmatch(r"\s*[*=\-~^#]{3,}\s*", l)]
    if not lines:
      continue
    if all(l.startswith((" ", "\t")) for l in lines) or any(
        l.lstrip().startswith((">>>", "...")) for l in lines):
      # Code / indented block: one line per "sentence".
      out.extend(" ".join(l.split()) for l in lines)
      continue
    joined = " ".join(" ".join(l.split()) for l in lines)
    # Drop reST underlines such as "*******".
    for sent in _SENT_END.sub(lambda m: m.group(1) + "\n", joined).split("\n"):
      sent = sent.strip()
      if sent and not re.fullmatch(r"[*=\-~^#]+", sent):
        out.append(sent)
  return out


def demo_documents() -> list[tuple[str, list[str]]]:
  """(topic name, sentences) for every pydoc topic, sorted by name."""
  docs = []
  for name in sorted(topics.topics):
    sents = split_sentences(topics.topics[name])
    if sents:
      docs.append((name, sents))
  return docs


def write_demo_corpus(directory: str) -> tuple[str, str]:
  """Writes the demo corpus under ``directory``; returns (train glob, eval glob).

  Idempotent: files are written once (atomically) and reused.
  """
  directory = os.path.join(directory, f"demo_corpus_{_VERSION}")
  train_glob = os.path.join(directory, "train-*.txt")
  eval_path = os.path.join(directory, "eval.txt")
  done = os.path.join(directory, "DONE")
  if tf.io.gfile.exists(done):
    return train_glob, eval_path
  tf.io.gfile.makedirs(directory)
  docs = demo_documents()
  train_docs = [d for i, d in enumerate(docs) if i % EVAL_EVERY]
  eval_docs = [d for i, d in enumerate(docs) if not i % EVAL_EVERY]

  def _write(path, docs_):
    # One temporary name per writer: every process of a multi-host run
    # writes the same files into a shared workdir, and with one shared name
    # a writer's rename would take the other's file away (NotFoundError).
    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with tf.io.gfile.GFile(tmp, "w") as f:
      f.write("\n\n".join("\n".join(s) for _, s in docs_) + "\n")
    tf.io.gfile.rename(tmp, path, overwrite=True)

  for k in range(NUM_TRAIN_FILES):
    _write(os.path.join(directory, f"train-{k:05d}.txt"),
           train_docs[k::NUM_TRAIN_FILES])
  _write(eval_path, eval_docs)
  with tf.io.gfile.GFile(done, "w") as f:
    f.write("ok\n")
  logging.info("Wrote demo corpus (%d train, %d eval documents) to %s",
               len(train_docs), len(eval_docs), directory)
  return train_glob, eval_path


# -----------------------------------------------------------------------------
# Synthetic corpora (tests and benchmarks).
# -----------------------------------------------------------------------------

_SYLLABLES = ("ka", "lo", "mi", "ne", "ra", "su", "to", "vi", "be", "do", "fa",
              "gu", "hi", "jo", "pe", "qui", "sa", "ti", "ul", "wo", "xe", "zy")


def synthetic_documents(num_docs: int, seed: int = 0, *,
                        unique_words: bool = False, sentences=(2, 12),
                        words=(3, 15)) -> list[list[str]]:
  """Documents (lists of sentences) of pseudo-words.

  ``unique_words``: every word in the corpus is a different ``w<n>``, numbered
  in reading order, so a token identifies its document and position.
  """
  rng = np.random.default_rng(seed)
  vocab = ["".join(rng.choice(_SYLLABLES, size=rng.integers(1, 4)))
           for _ in range(600)]
  zipf = 1.0 / np.arange(1, len(vocab) + 1)
  zipf /= zipf.sum()
  counter = 0
  docs = []
  for _ in range(num_docs):
    doc = []
    for _ in range(rng.integers(sentences[0], sentences[1] + 1)):
      n = int(rng.integers(words[0], words[1] + 1))
      if unique_words:
        ws = [f"w{counter + i}" for i in range(n)]
        counter += n
      else:
        ws = list(rng.choice(vocab, size=n, p=zipf))
        ws[0] = ws[0].capitalize()
      doc.append(" ".join(ws) + ("" if unique_words else "."))
    docs.append(doc)
  return docs


def write_documents(path: str, docs: list[list[str]]) -> str:
  """Writes documents in the BERT layout (blank line between documents)."""
  with tf.io.gfile.GFile(path, "w") as f:
    f.write("\n\n".join("\n".join(d) for d in docs) + "\n")
  return path
