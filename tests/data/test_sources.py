"""data_sources.plan: which sources a run trains and evaluates on."""

import os

import pytest

from bert_jax import config_lib
from bert_jax.data import demo_corpus
from bert_jax.data import sources as data_sources


def data_config(**fields):
  data = config_lib.get_config("tiny").data
  data.update(sources="", train_files="", eval_sources="", eval_files="",
              eval_fraction=0.0)
  data.update(**fields)
  return data


def test_eval_defaults_to_held_out_documents_of_train():
  plan = data_sources.plan(
      data_config(sources="/c/a-*.txt@2;tfds:wiki:train@1",
                  eval_fraction=0.1), None)
  assert [str(s) for s in plan.train] == ["text:/c/a-*.txt@2",
                                          "tfds:wiki:train@1"]
  assert plan.eval == plan.train
  assert plan.eval_from_train and plan.holds_out and not plan.uses_demo
  # Without an eval fraction nothing is held out: eval reads train documents.
  plan = data_sources.plan(data_config(train_files="/c/a-*.txt"), None)
  assert plan.eval_from_train and not plan.holds_out


def test_explicit_eval_wins_and_nothing_is_held_out():
  plan = data_sources.plan(
      data_config(train_files="/c/t-*.txt", eval_files="/c/e.txt",
                  eval_fraction=0.1), None)
  assert [s.spec for s in plan.eval] == ["/c/e.txt"]
  assert not plan.eval_from_train and not plan.holds_out
  # eval_sources wins over eval_files, sources over train_files.
  plan = data_sources.plan(
      data_config(sources="/c/s.txt", train_files="/c/t-*.txt",
                  eval_sources="/c/es.txt", eval_files="/c/e.txt"), None)
  assert [s.spec for s in plan.train] == ["/c/s.txt"]
  assert [s.spec for s in plan.eval] == ["/c/es.txt"]


def test_demo_corpus_when_no_train_sources(tmp_path):
  plan = data_sources.plan(data_config(eval_fraction=0.1), str(tmp_path))
  assert plan.uses_demo and not plan.eval_from_train and not plan.holds_out
  train_glob, eval_path = demo_corpus.write_demo_corpus(str(tmp_path))
  assert [s.spec for s in plan.train] == [train_glob]
  assert [s.spec for s in plan.eval] == [eval_path]
  assert os.path.exists(eval_path)
  with pytest.raises(ValueError, match="no workdir"):
    data_sources.plan(data_config(), None)
  with pytest.raises(ValueError, match="data.eval_sources"):
    data_sources.plan(data_config(train_files="/c/t.txt",
                                  eval_sources="/c/e.txt@-1"), None)


def test_hosts_writing_the_demo_corpus_at_once_do_not_collide(tmp_path):
  """Every process of a multi-host run writes the demo corpus into the shared
  workdir. With one temporary name per file shared by the writers, one
  writer's rename would take the other's file away (process 0 of a two-host
  run dies with 'NotFoundError: .../train-00000.txt.tmp' while process 1
  waits for its tokenizer). Eight writers at once, five times: no error, and
  the files one writer alone would write."""
  import threading

  from bert_jax.data import demo_corpus
  alone = tmp_path / "alone"
  demo_corpus.write_demo_corpus(str(alone))
  expected = {p.name: p.read_bytes()
              for p in (alone / f"demo_corpus_{demo_corpus._VERSION}").iterdir()}
  for attempt in range(5):
    shared = tmp_path / f"shared{attempt}"
    errors = []

    def write():
      try:
        demo_corpus.write_demo_corpus(str(shared))
      except Exception as e:  # pylint: disable=broad-except
        errors.append(e)

    writers = [threading.Thread(target=write) for _ in range(8)]
    for w in writers:
      w.start()
    for w in writers:
      w.join()
    assert not errors, errors[0]
    written = {p.name: p.read_bytes()
               for p in (shared / f"demo_corpus_{demo_corpus._VERSION}").iterdir()}
    assert written == expected
