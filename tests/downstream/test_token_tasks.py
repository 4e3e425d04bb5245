"""Token tagging end to end: learns a generated NER task, cannot learn
shuffled tags, resumes exactly, writes a conlleval file, exports to a
Hugging Face BertForTokenClassification whose pipeline agrees with it.

One fine-tuning run of a tiny random BERT (tests/helpers/tiny_models) on
the generated task of tests/helpers/span_tag_tasks (entities of two types
in filler text; some sentences longer than the 32-token window) is shared by
the tests of this file; the shuffled-tags run and the resumed run have the
same shapes, so the XLA cache compiles them once.
"""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from bert_jax.data import token_sources
from bert_jax.tasks import entity_metrics
from bert_jax.downstream import finetuning
from tests import helpers
from tests.helpers import span_tag_tasks
from tests.helpers import tiny_models

NUM_STEPS, SAVE_AT = 100, 50


def tagging_config(init_from, train, dev):
  config = tiny_models.finetune_config(init_from, train, dev,
                                       num_steps=NUM_STEPS,
                                       learning_rate=5e-3)
  config.task.update(name="generated_tags", kind="token", buckets=(32,))
  config.train.update(log_every=1, warmup_steps=10, warmup_fraction=0.0)
  config.checkpoint.update(save_every_steps=SAVE_AT, max_to_keep=5)
  return config


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  d = tmp_path_factory.mktemp("token_tasks")
  return dict(dir=d, hf=tiny_models.make_hf_dir(str(d / "base")))


def _run(base, name, shuffle_tags=False):
  train, dev = span_tag_tasks.write_tagging_task(
      str(base["dir"] / f"{name}_data"), shuffle_tags=shuffle_tags)
  config = tagging_config(base["hf"]["out"], train, dev)
  workdir = str(base["dir"] / name)
  return dict(results=finetuning.run(config, workdir), workdir=workdir,
              config=config, dev=dev)


@pytest.fixture(scope="module")
def learned(base):
  return _run(base, "learned")


def _train_losses(workdir) -> dict:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}


@pytest.mark.slow
def test_learnable_tags_reach_f1_and_shuffled_tags_stay_near_chance(
    base, learned):
  scores = learned["results"]["scores"]["validation"]
  assert scores["f1"] >= 0.95, scores
  details = learned["results"]["details"]["validation"]
  assert set(details["per_type"]) == {"PER", "LOC"}
  assert all(d["f1"] >= 0.9 for d in details["per_type"].values())
  dev = token_sources.read_conll(learned["dev"])
  assert max(len(w) for w in dev.words) > 32  # Some need two windows.
  shuffled = _run(base, "shuffled", shuffle_tags=True)
  noise = shuffled["results"]["scores"]["validation"]
  # Tags permuted over all words: no word predicts its tag, so entity F1
  # stays near what random tags of the same frequencies give (~0.1 here).
  assert noise["f1"] < 0.3, noise


@pytest.mark.slow
def test_results_and_the_conlleval_predictions_file(learned):
  results, workdir = learned["results"], learned["workdir"]
  saved = json.loads(open(os.path.join(workdir, "results.json")).read())
  assert saved["kind"] == "token" and saved["scores"] == results["scores"]
  assert saved["label_names"] == ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]
  assert saved["main_score"] == pytest.approx(
      results["scores"]["validation"]["f1"])
  path = os.path.join(workdir, "predictions", "validation",
                      "predictions.conll")
  assert saved["predictions"] == [os.path.relpath(path, workdir)]
  dev = token_sources.read_conll(learned["dev"])
  # Read back as conlleval reads it: word gold predicted, blank lines.
  words, gold, pred, cur = [], [], [], ([], [], [])
  for line in open(path).read().split("\n"):
    if not line.strip():
      if cur[0]:
        for acc, part in zip((words, gold, pred), cur):
          acc.append(part)
      cur = ([], [], [])
      continue
    w, g, p = line.split(" ")
    for part, x in zip(cur, (w, g, p)):
      part.append(x)
  assert words == dev.words and gold == dev.tags
  again = entity_metrics.entity_scores(gold, pred)
  assert again["f1"] == results["scores"]["validation"]["f1"]


@pytest.mark.slow
def test_rerun_after_a_kill_continues_with_the_same_losses(base, learned):
  """A run stopped after its step-50 checkpoint and rerun gives steps
  51-100 with exactly the uninterrupted run's losses (state and data
  position both restored)."""
  whole = learned["workdir"]
  part = str(base["dir"] / "part")
  shutil.copytree(whole, part)
  for step in os.listdir(os.path.join(part, "checkpoints")):
    if step.isdigit() and int(step) > SAVE_AT:
      shutil.rmtree(os.path.join(part, "checkpoints", step))
  os.remove(os.path.join(part, "metrics.jsonl"))
  shutil.rmtree(os.path.join(part, "predictions"))
  results = finetuning.run(learned["config"], part)
  resumed, expected = _train_losses(part), _train_losses(whole)
  assert sorted(resumed) == list(range(SAVE_AT + 1, NUM_STEPS + 1))
  for step, loss in resumed.items():
    assert loss == expected[step], (step, loss, expected[step])
  assert results["scores"] == learned["results"]["scores"]


# --- Hugging Face export -----------------------------------------------------
@pytest.fixture(scope="module")
def exported(learned):
  pytest.importorskip("torch")
  from bert_jax import export
  out = os.path.join(learned["workdir"] + "_hf")
  export.export_run(learned["workdir"], out)
  return out


@pytest.mark.slow
def test_export_is_a_token_classifier_with_the_run_tags(learned, exported):
  transformers = pytest.importorskip("transformers")
  cfg = json.loads(open(os.path.join(exported, "config.json")).read())
  assert cfg["architectures"] == ["BertForTokenClassification"]
  names = learned["results"]["label_names"]
  assert cfg["id2label"] == {str(i): n for i, n in enumerate(names)}
  model = transformers.AutoModelForTokenClassification.from_pretrained(
      exported)
  assert type(model).__name__ == "BertForTokenClassification"


def _pipeline_tags(entities, words) -> list[str]:
  """The pipeline's entities as one IOB2 tag per word of `words`."""
  starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
  tags = ["O"] * len(words)
  for e in entities:
    covered = [k for k, s in enumerate(starts)
               if e["start"] <= s < e["end"]]
    for j, k in enumerate(covered):
      tags[k] = ("B-" if j == 0 else "I-") + e["entity_group"]
  return tags


@pytest.mark.slow
def test_pipeline_agrees_with_the_predictions_file(learned, exported):
  transformers = pytest.importorskip("transformers")
  pytest.importorskip("torch").set_num_threads(1)  # Busy cores crawl.
  path = os.path.join(learned["workdir"], "predictions", "validation",
                      "predictions.conll")
  sentences = [block.split("\n") for block in
               open(path).read().strip().split("\n\n")]
  words = [[line.split(" ")[0] for line in s] for s in sentences]
  ours = [[line.split(" ")[2] for line in s] for s in sentences]
  tagger = transformers.pipeline("token-classification", model=exported,
                                 aggregation_strategy="first")
  got = tagger([" ".join(ws) for ws in words])
  same = total = 0
  for ws, mine, entities in zip(words, ours, got):
    # Ours, read as entities (conlleval) and written back as IOB2.
    canon = ["O"] * len(ws)
    for kind, a, b in entity_metrics.entities(mine):
      canon[a:b + 1] = ["B-" + kind] + ["I-" + kind] * (b - a)
    theirs = _pipeline_tags(entities, ws)
    same += sum(x == y for x, y in zip(canon, theirs))
    total += len(ws)
  print(f"pipeline agrees on {same}/{total} words")
  # Sentences over 32 tokens are two windows for us and one 64-token input
  # for the pipeline (other context), the only source of disagreement.
  assert same >= 0.99 * total, (same, total)


# --- bad input: one error before anything is written --------------------------
# (tests/downstream/test_span_tasks.py shows the command line turning such an
# error into one line and a non-zero exit.)
def test_conll_file_without_tag_column_is_one_error(base, tmp_path):
  train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
  train.write_text("Jim B-PER\nruns O\n\nAnn\nsings O\n")
  dev.write_text("Jim B-PER\n")
  config = tagging_config(base["hf"]["out"], str(train), str(dev))
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(tmp_path / "out"))
  assert str(e.value) == (
      f"{train}:4: 1 column(s) ['Ann'], but the word is column 0 and the tag "
      "column -1 (task.tag_column) of at least 2: is the tag column missing?")
  assert helpers.written_files(tmp_path / "out") == []


def test_an_empty_split_is_one_error_before_anything_is_written(base,
                                                                tmp_path):
  train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
  train.write_text("Jim B-PER\nruns O\n")
  dev.write_text("-DOCSTART- -X- O\n\n\n")
  config = tagging_config(base["hf"]["out"], str(train), str(dev))
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(tmp_path / "out"))
  assert str(e.value).startswith(
      "The validation split of task 'generated_tags' (task.validation_file="
      f"{dev}) holds no sentence")
  assert helpers.written_files(tmp_path / "out") == []


@pytest.mark.parametrize("case", ["label_names", "phases"])
def test_bad_setup_is_one_error_before_anything_is_written(base, tmp_path,
                                                           case):
  """Sentence tasks' refusals that apply to a token task: label names
  other than its tags (which name themselves), phases."""
  train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
  train.write_text("Jim B-PER\nruns O\n")
  dev.write_text("Ann B-PER\n")
  config = tagging_config(base["hf"]["out"], str(train), str(dev))
  if case == "label_names":
    config.task.label_names = ("person", "other")
    expected = ("task.label_names=('person', 'other'): a token task's tags "
                "name themselves (O, B-PER, in id order, saved as "
                "label_map.json); leave task.label_names empty.")
  else:
    config.train.phases = (dict(num_steps=2, seq_length=32),) * 2
    expected = ("train.phases / train.recipe apply to pretraining runs only "
                "(a fine-tuning run's batches are its task's length "
                "buckets, task.buckets); leave them empty.")
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(tmp_path / "out"))
  assert str(e.value) == expected
  assert helpers.written_files(tmp_path / "out") == []
