"""Generated token-tagging and QA tasks a tiny BERT learns, as files.

The generators are tools/make_span_tag_tasks.py's; here they get word lists
from the hand-written vocabulary of ``tiny_models`` (every word is in it, so
the tokenizer is the checkpoint's and nothing is downloaded), and dev uses
the train words (nothing to transfer: the tests check the machinery).

* Tagging (CoNLL, IOB2): PER / LOC entities in filler text; an entity word
  splits into two sub-tokens (``wonder ##ful``); some sentences are longer
  than a 32-token window.
* QA (SQuAD 2.0 JSON): the answer runs from a start word to an end word
  (``wonder ##ful`` among the ends); contexts longer than a 64-token window;
  a share of unanswerable questions.
"""

from __future__ import annotations

from tests import helpers

# (first words, second words) of each entity type: a word's tag follows
# from the word itself, so a tiny model learns it in a few hundred steps.
ENTITIES = {"PER": (("river", "bank", "money", "cash"), ("account", "opened")),
            "LOC": (("water", "day", "night", "wonderful"), ("walked",
                                                               "along"))}
TAG_FILLER = ("the a it was is this that movie film story plot acting and "
              "but not very really quite i we you they saw watched of to on "
              "at for with about yes no did").split()
# An answer runs from a start word to an end word; neither list appears
# elsewhere in an answerable context.
START_WORDS = ("river", "bank", "water")
END_WORDS = ("money", "cash", "night", "wonderful")
QA_FILLER = TAG_FILLER + [",", "."]
QUESTION = "what is the answer ?"  # 5 tokens


def _tool():
  return helpers.import_tool("make_span_tag_tasks")


def write_tagging_task(directory: str, n_train: int = 300, n_dev: int = 100,
                       shuffle_tags: bool = False, seed: int = 0,
                       lengths: str = "uniform"):
  """train.txt and dev.txt (CoNLL); `lengths` "conll": CoNLL-2003's mean
  sentence length (the tool's)."""
  return _tool().write_tagging_task(
      directory, train_entities=ENTITIES, dev_entities=ENTITIES,
      filler=TAG_FILLER, n_train=n_train, n_dev=n_dev,
      shuffle_tags=shuffle_tags, seed=seed, lengths=lengths)


def write_qa_task(directory: str, n_train: int = 400, n_dev: int = 100,
                  unanswerable: float = 0.3, seed: int = 0,
                  border: int | None = None):
  """train.json and dev.json (SQuAD 2.0); `border`: see the tool."""
  words = (START_WORDS, END_WORDS)
  return _tool().write_qa_task(
      directory, train_words=words, dev_words=words, filler=QA_FILLER,
      question=QUESTION, n_train=n_train, n_dev=n_dev,
      unanswerable=unanswerable, seed=seed, border=border)
