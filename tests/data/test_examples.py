"""data/examples.py's RoBERTa-style builders and the held-out split on a
dozen hand-written lines (the pipeline-level checks of the same, on the
demo corpus, are in the slow tier)."""

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import examples
from bert_jax.data import tokenizers
from tests.helpers import tiny_models

T = 16
DOCUMENTS = [
    ["the movie was good .", "we saw it on a long night .",
     "i loved the story and the acting ."],
    ["the river bank was long .", "we walked along the water ."],
    ["did you like it ?", "yes , it was fun .", "what a film !",
     "the plot was not boring at all , it was really quite good ."],
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  tiny_models.write_vocab(path)
  return tokenizers.load(path, "wordpiece", True)


def _lines() -> list[str]:
  """The google-research/bert layout: a blank line after each document."""
  return [line for doc in DOCUMENTS for line in doc + [""]]


def _build(tok, *, packing=False, mode="all", eval_fraction=0.0):
  options = examples.ExampleOptions(
      seq_length=T, objective=config_lib.PACKED, short_seq_prob=0.0,
      max_line_bytes=1000, block_lines=64, mode=mode,
      eval_fraction=eval_fraction, packing=packing)
  out = examples.ExampleBuilder(tok, options)(
      tf.constant(_lines()), tf.constant([0, 1], tf.int64))
  return {k: v.numpy() for k, v in out.items()}


def _rows(out) -> list[list[int]]:
  return [ids[:mask.sum()].tolist()
          for ids, mask in zip(out["input_ids"], out["input_mask"])]


def _document_ids(tok, doc) -> list[int]:
  """Its token ids, each line cut to T - 3 tokens as the builder cuts it."""
  return [i for line in doc for i in list(tok.encode(line))[:T - 3]]


def test_packed_rows_hold_the_stream_with_a_sep_after_each_document(tok):
  out = _build(tok)
  rows = _rows(out)
  assert all(row[0] == tok.cls_id and len(row) <= T for row in rows)
  assert (out["segment_ids"] == 0).all()
  assert (out["next_sentence_labels"] == 0).all()
  # The rows, read in order, are the token stream with a [SEP] after each
  # document; a row that ends inside a document gets a [SEP] of its own.
  expected = [i for doc in DOCUMENTS
              for i in _document_ids(tok, doc) + [tok.sep_id]]
  k = 0
  for row in rows:
    for j, i in enumerate(row[1:], 1):
      if k < len(expected) and i == expected[k]:
        k += 1
      else:
        assert (i, j) == (tok.sep_id, len(row) - 1), (row, k)
  assert k == len(expected)
  stats = dict(zip(examples.STATS, out[examples.STATS_KEY].sum(axis=0)))
  assert stats["documents"] == len(DOCUMENTS)
  assert stats["examples"] == len(rows)


def test_document_chunks_never_cross_a_document(tok):
  rows = _rows(_build(tok, packing=True))
  assert all(row[0] == tok.cls_id and row[-1] == tok.sep_id
             and len(row) <= T for row in rows)
  bodies = [row[1:-1] for row in rows]
  assert all(tok.sep_id not in body for body in bodies)
  # Consecutive rows rebuild each document exactly, one after the other.
  rebuilt, k = [], 0
  for doc in DOCUMENTS:
    want, got = _document_ids(tok, doc), []
    while len(got) < len(want):
      got += bodies[k]
      k += 1
    rebuilt.append(got == want)
  assert rebuilt == [True] * len(DOCUMENTS) and k == len(bodies)


def test_held_out_documents_are_the_eval_split_and_only_it(tok):
  def tokens(out):
    return sorted(i for row in _rows(out) for i in row
                  if i not in (tok.cls_id, tok.sep_id))
  everything = tokens(_build(tok))
  train = tokens(_build(tok, mode="train", eval_fraction=0.5))
  held_out = tokens(_build(tok, mode="eval", eval_fraction=0.5))
  assert train and held_out
  assert sorted(train + held_out) == everything
  # Whole documents: each is on one side.
  for doc in DOCUMENTS:
    ids = sorted(_document_ids(tok, doc))
    sides = [all(np.isin(ids, side)) for side in (train, held_out)]
    assert any(sides), doc


def test_an_unknown_hold_out_mode_is_refused():
  data = config_lib.data_config()
  with pytest.raises(ValueError, match=r"mode='test' must be one of "
                     r"\('all', 'train', 'eval'\)\."):
    examples.ExampleOptions.from_config(data, mode="test")
