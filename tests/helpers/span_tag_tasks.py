"""Generated token-tagging and QA tasks a tiny BERT can learn, as files.

Both use the hand-written vocabulary of ``tiny_models`` (every word is in
it, so the tokenizer is the checkpoint's and nothing is downloaded).

* Tagging (CoNLL columns, IOB2): entities of two types (PER, LOC; a first
  word, sometimes a second word from another list; never adjacent) inside
  random filler text; an entity word splits into two sub-tokens
  (``wonder ##ful``); some sentences are longer than a 32-token window. ``shuffle_tags`` permutes the
  tags over all words: nothing left to learn.
* QA (SQuAD JSON): the answer runs from a start word to an end word (two
  or three words, ``wonder ##ful`` among the ends); contexts are longer than
  a 64-token window, so answers fall in later windows and some straddle a
  window border; with ``unanswerable`` a share of the questions has no
  answer (SQuAD 2.0 ``is_impossible``), half of them a lone start word.
"""

from __future__ import annotations

import json
import os
import random

# (first words, second words) of each entity type: a word's tag follows
# from the word itself, so a tiny model learns it in a few hundred steps.
ENTITIES = {"PER": (("river", "bank", "money", "cash"), ("account", "opened")),
            "LOC": (("water", "day", "night", "wonderful"), ("walked",
                                                               "along"))}
TAG_FILLER = ("the a it was is this that movie film story plot acting and "
              "but not very really quite i we you they saw watched of to on "
              "at for with about yes no did").split()


def tagged_sentence(r: random.Random, min_words=4, max_words=45):
  words, tags = [], []
  n = r.randint(min_words, max_words)
  while len(words) < n:
    if r.random() < 0.25 and (not tags or tags[-1] == "O"):
      kind = r.choice(sorted(ENTITIES))
      first, second = ENTITIES[kind]
      words.append(r.choice(first))
      tags.append("B-" + kind)
      if r.random() < 0.4:
        words.append(r.choice(second))
        tags.append("I-" + kind)
    else:
      words.append(r.choice(TAG_FILLER))
      tags.append("O")
  return words, tags


def write_tagging_task(directory: str, n_train: int = 300, n_dev: int = 100,
                       shuffle_tags: bool = False, seed: int = 0
                       ) -> tuple[str, str]:
  """train.txt and dev.txt (CoNLL: "word POS tag", -DOCSTART- first)."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name, n, s in (("train", n_train, seed), ("dev", n_dev, seed + 1)):
    r = random.Random(s)
    sentences = [tagged_sentence(r) for _ in range(n)]
    if shuffle_tags:
      flat = [t for _, ts in sentences for t in ts]
      r.shuffle(flat)
      it = iter(flat)
      sentences = [(ws, [next(it) for _ in ws]) for ws, _ in sentences]
    path = os.path.join(directory, f"{name}.txt")
    with open(path, "w") as f:
      f.write("-DOCSTART- -X- O\n\n")
      for ws, ts in sentences:
        f.write("".join(f"{w} X {t}\n" for w, t in zip(ws, ts)) + "\n")
    paths.append(path)
  return paths[0], paths[1]


# An answer runs from a start word to an end word (0-1 filler words
# between); neither list appears elsewhere in an answerable context.
START_WORDS = ("river", "bank", "water")
END_WORDS = ("money", "cash", "night", "wonderful")
QA_FILLER = ("the a it was is this that movie film story plot acting and "
             "but not very really quite i we you they saw watched of to on "
             "at for with about yes no did , .").split()
QUESTION = "what is the answer ?"


def qa_example(r: random.Random, qid: str, answerable: bool,
               min_words=50, max_words=110, border=None):
  """(SQuAD qa dict, context): filler words and, if answerable, the answer
  (start word, 0-1 filler, end word) at a random place, or at context token
  `border` (every word before it is one token) when given; an unanswerable
  context may hold a start word but no end word."""
  words = [r.choice(QA_FILLER) for _ in range(r.randint(min_words,
                                                        max_words))]
  qa = dict(id=qid, question=QUESTION, is_impossible=not answerable,
            answers=[])
  if answerable:
    span = [r.choice(START_WORDS)] + [r.choice(QA_FILLER)] * r.randint(
        0, 1) + [r.choice(END_WORDS)]
    at = r.randint(0, len(words)) if border is None else min(border,
                                                              len(words))
    words[at:at] = span
    start = len(" ".join(words[:at])) + (1 if at else 0)
    qa["answers"] = [dict(text=" ".join(span), answer_start=start)]
  elif r.random() < 0.5:
    words.insert(r.randint(0, len(words)), r.choice(START_WORDS))
  return qa, " ".join(words)


def write_qa_task(directory: str, n_train: int = 400, n_dev: int = 100,
                  unanswerable: float = 0.3, seed: int = 0,
                  border: int | None = None) -> tuple[str, str]:
  """train.json and dev.json in the official SQuAD 2.0 format (one
  paragraph per question). With `border` (the context index of a window's
  last token) a fifth of the answers start there: they straddle that window
  border and lie whole only in the next window."""
  os.makedirs(directory, exist_ok=True)
  paths = []
  for name, n, s in (("train", n_train, seed), ("dev", n_dev, seed + 1)):
    r = random.Random(s)
    paragraphs = []
    for i in range(n):
      at = border if border is not None and r.random() < 0.2 else None
      qa, context = qa_example(r, f"{name}-{i}", r.random() >= unanswerable,
                               border=at)
      paragraphs.append(dict(context=context, qas=[qa]))
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
      json.dump(dict(version="v2.0", data=[dict(title="generated",
                                                paragraphs=paragraphs)]), f)
    paths.append(path)
  return paths[0], paths[1]
