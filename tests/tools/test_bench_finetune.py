"""tools/bench_finetune.py batching (no timing) and tools/make_demo_task.py."""

import collections

import numpy as np
import pytest

from tests import helpers


def _tool(name):
  return helpers.import_tool(name)


def test_hf_batches_pad_to_the_batch_longest_and_keep_every_token():
  rng = np.random.default_rng(0)
  encoded = [(rng.integers(5, 50, n), np.zeros(n, np.int32), np.int32(n % 3))
             for n in rng.integers(3, 40, 37)]
  batches = _tool("bench_finetune").dynamic_batches(encoded, 8, 0, seed=1)
  assert len(batches) == 37 // 8  # Full batches only.
  seen = []
  for b in batches:
    lengths = b["attention_mask"].sum(1)
    assert b["input_ids"].shape == (8, lengths.max())  # Longest, not fixed.
    assert b["labels"].dtype == np.int64
    for ids, n, label in zip(b["input_ids"], lengths, b["labels"]):
      assert (ids[n:] == 0).all()
      seen.append((tuple(ids[:n]), int(label)))
  want = {(tuple(a), int(l)) for a, _, l in encoded}
  assert len(seen) == len(set(seen)) and set(seen) <= want


def test_group_by_length_batches_are_huggingfaces_and_pad_less():
  """The grouped side reads the rows in transformers' LengthGroupedSampler
  order (each full batch as that order cuts it), every row once, with far
  less padding than random batches."""
  import torch
  from transformers import trainer_pt_utils
  rng = np.random.default_rng(0)
  encoded = [(rng.integers(5, 50, n), np.zeros(n, np.int32), np.int32(n % 3))
             for n in rng.integers(3, 60, 1000)]
  bench = _tool("bench_finetune")
  lengths = [len(r[0]) for r in encoded]
  order = bench.hf_order(lengths, 8, seed=3, group_by_length=True)
  theirs = trainer_pt_utils.get_length_grouped_indices(
      lengths, 8, generator=torch.Generator().manual_seed(3))
  want = {tuple(sorted(theirs[i:i + 8])) for i in range(0, 1000, 8)}
  assert {tuple(sorted(order[i:i + 8])) for i in range(0, 1000, 8)} == want
  assert sorted(order) == list(range(1000))

  def padding(grouped):
    batches = bench.dynamic_batches(encoded, 8, 0, seed=3,
                                    group_by_length=grouped)
    return sum(b["attention_mask"].size - b["attention_mask"].sum()
               for b in batches)

  assert padding(True) < 0.2 * padding(False)


def test_demo_task_has_four_topics_and_a_disjoint_dev_split():
  rows = _tool("make_demo_task").task_rows()
  train, dev = rows["train"], rows["dev"]
  topics = {label for _, label in train}
  assert topics == set(_tool("make_demo_task").TOPICS)
  assert {label for _, label in dev} == topics
  assert 3 * len(dev) < len(train) < 5 * len(dev)
  # Repeated code lines ("pass", ...) are the only overlap (17 of 314).
  dev_text = {t for t, _ in dev}
  assert len(dev_text & {t for t, _ in train}) < 0.06 * len(dev_text)
  lengths = [len(t.split()) for t, _ in train]
  assert min(lengths) >= 3 and max(lengths) > 40  # Varied: buckets matter.


def test_token_and_span_features_batch_for_hugging_face(tmp_path):
  """The HF side gets every window once, padded to its batch's longest,
  with its labels (-100 where ours has weight 0) and answer positions."""
  from bert_jax.data import span_features
  from bert_jax.data import squad_sources
  from bert_jax.data import token_features
  from bert_jax.data import token_sources
  from bert_jax.data import tokenizers
  from tests.helpers import span_tag_tasks
  from tests.helpers import tiny_models
  tiny_models.write_vocab(str(tmp_path / "vocab.txt"))
  tok = tokenizers.load(str(tmp_path / "vocab.txt"), "wordpiece", True)
  bench = _tool("bench_finetune")
  train, _ = span_tag_tasks.write_tagging_task(str(tmp_path / "ner"),
                                               n_train=40, n_dev=2)
  data = token_sources.read_conll(train)
  features, _ = token_features.build(data, tok, token_sources.tag_order(data),
                                     seq_length=32, stride=15)
  rows = bench.feature_rows(features, "token")
  batches = bench.dynamic_feature_batches(rows, 8, 0, seed=0)
  assert len(batches) == len(rows) // 8  # Full batches only.
  window = lambda *arrays: tuple(tuple(np.asarray(a).tolist()) for a in arrays)
  seen = collections.Counter()
  for b in batches:
    n = b["attention_mask"].sum(1)
    assert b["input_ids"].shape[1] == n.max()
    assert np.all((b["labels"] == -100) | (b["attention_mask"] == 1))
    for i, k in enumerate(n):
      assert (b["input_ids"][i, k:] == 0).all()
      seen[window(b["input_ids"][i, :k], b["token_type_ids"][i, :k],
                  b["labels"][i, :k])] += 1
  windows = collections.Counter(
      window(r["input_ids"], r["token_type_ids"], r["labels"]) for r in rows)
  # Every window once, but for the len(rows) % 8 a last full batch leaves.
  assert seen <= windows, (
      f"{(seen - windows).total()} batched windows more than the rows hold")
  assert windows.total() - seen.total() == len(rows) % 8
  assert max(np.sum(r["labels"] != -100) for r in rows) > 0
  train, _ = span_tag_tasks.write_qa_task(str(tmp_path / "qa"), n_train=10,
                                          n_dev=2)
  examples, _ = squad_sources.read_json(train)
  features, _ = span_features.build(examples, tok, seq_length=64,
                                    max_query_length=16, doc_stride=24)
  rows = bench.feature_rows(features, "span")
  for r, s, e in zip(rows, features.arrays["start_positions"],
                     features.arrays["end_positions"]):
    assert (r["start_positions"], r["end_positions"]) == (s, e)
    assert r["token_type_ids"].max() == 1  # the context segment


def test_english_tasks_hold_out_the_dev_names(tmp_path):
  make = _tool("make_span_tag_tasks")
  train, dev = make.write_english("token", str(tmp_path / "ner"), n_train=50,
                                  n_dev=50)
  words = lambda p: {ln.split()[0] for ln in open(p) if ln.strip()
                     and ln.split()[-1] != "O"}
  people = set(make.PER_FIRST[0]) | set(make.PER_FIRST[1])
  assert words(train) & people <= set(make.PER_FIRST[0])
  assert words(dev) & people <= set(make.PER_FIRST[1])
  train, dev = make.write_english("span", str(tmp_path / "qa"), n_train=20,
                                  n_dev=20)
  import json
  answers = lambda p: {a["text"].split()[0] for para in json.load(open(p))[
      "data"][0]["paragraphs"] for qa in para["qas"] for a in qa["answers"]}
  assert answers(train) <= set(make.PER_FIRST[0])
  assert answers(dev) <= set(make.PER_FIRST[1]) and answers(dev)


@pytest.mark.slow
def test_documented_command_parses_without_a_workdir():
  """docs/downstream.md's command: the tool writes no workdir and asks for
  none. Flags defined as the script defines them (define_flags) and parsed
  in a child, absl's required-flag checks included; nothing is
  benchmarked."""
  import subprocess
  import sys
  argv = ["bench_finetune", "--config", "configs/finetune.py",
          "--config.task.name=pydoc_topics", "--config.task.text_field=text",
          "--config.task.train_file=/tmp/demo_task/train.csv",
          "--config.task.validation_file=/tmp/demo_task/dev.csv",
          "--config.train.init_from=/tmp/bert_demo",
          "--config.data.seq_length=64", "--config.task.buckets=(16,32,64)",
          "--config.train.batch_size=32", "--rounds", "3", "--warmup", "2"]
  # (config_flags reads its --config.* overrides from sys.argv.)
  code = ("import sys; from absl import app; from absl import flags; "
          "from tests.helpers import import_tool; "
          f"sys.argv = {argv!r}; F = flags.FLAGS; "
          "import_tool('bench_finetune').define_flags(F, sys.argv); "
          "app.run(lambda _: print(F.config.task.buckets, F.rounds))")
  r = subprocess.run([sys.executable, "-c", code], cwd=helpers.REPO,
                     env=helpers.child_env(), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.split() == ["(16,", "32,", "64)", "3"], r.stdout
