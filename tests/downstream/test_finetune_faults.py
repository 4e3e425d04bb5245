"""Fine-tuning runs that look finished but are not, and bad task setups: a
SIGTERM leaves no final results and exits as a preempted pretraining run
does; results' train_loss is a window's mean; a workdir remembers its task;
an empty validation split, phases and a wrong label setup are one error
before anything is written.

One fine-tuning workdir (a tiny random BertModel directory: no MLM head, the
keyword task) is stopped by SIGTERM in a child, finished in-process, then
rerun with other files.
"""

import csv
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.downstream import finetuning
from bert_jax.training import trainer as trainer_lib
from tests import helpers
from tests.helpers import tiny_models


def _write(path, rows):
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text", "label"])
    w.writerows(rows)
  return str(path)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
  base = tmp_path_factory.mktemp("ft_faults")
  hf = tiny_models.make_hf_dir(str(base / "base"))
  # A BertModel directory (no MLM / NSP heads), as sentence-transformers'.
  encoder = str(base / "bertmodel")
  tiny_models.strip_mlm_head(hf["out"], encoder)
  train, dev = tiny_models.write_keyword_task(str(base / "task"), n_train=128,
                                              n_dev=16)
  return dict(base=base, hf=encoder, train=train, dev=dev)


def _config(task, **train):
  config = tiny_models.finetune_config(task["hf"], task["train"], task["dev"])
  config.task.buckets = (32,)
  config.train.update(dict(log_every=4, **train))
  return config


def _flags(config):
  """`config`'s task and train fields as bert_jax.finetune flags."""
  t, tr = config.task, config.train
  return [f"--config.task.name={t.name}",
          f"--config.task.train_file={t.train_file}",
          f"--config.task.validation_file={t.validation_file}",
          f"--config.task.text_field={t.text_field}",
          "--config.task.buckets=(32,)", "--config.data.seq_length=32",
          f"--config.train.init_from={tr.init_from}",
          f"--config.train.batch_size={tr.batch_size}",
          f"--config.train.learning_rate={tr.learning_rate}",
          f"--config.train.num_steps={tr.num_steps}",
          f"--config.train.log_every={tr.log_every}",
          "--config.model.dtype=float32"]


@pytest.fixture(scope="module")
def preempted(task):
  """A fine-tuning child stopped by SIGTERM after its 4th step."""
  workdir = str(task["base"] / "run")
  config = _config(task, num_steps=100_000)  # Never reached.
  with open(f"{workdir}.log", "w") as log:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bert_jax.finetune", "--config",
         os.path.join(helpers.REPO, "configs", "finetune.py"), "--workdir",
         workdir, *_flags(config)], cwd=helpers.REPO, env=helpers.child_env(),
        stdout=log, stderr=subprocess.STDOUT, text=True)
    step = helpers.wait_for_step(proc, workdir, 4)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
  return dict(workdir=workdir, rc=proc.returncode, step=step,
              log=helpers.run_log(workdir))


@pytest.mark.slow
def test_sigterm_writes_no_results_and_exits_as_pretraining(preempted):
  r = preempted
  assert r["rc"] == 0, r["log"][-3000:]
  steps = sorted(int(s) for s in os.listdir(os.path.join(r["workdir"],
                                                         "checkpoints")))
  assert steps and steps[-1] >= r["step"]
  assert (f"preempted at step {steps[-1]}: checkpoint saved, no results yet; "
          "run the same command to resume.") in r["log"]
  assert "Traceback" not in r["log"]
  assert not os.path.exists(os.path.join(r["workdir"], "results.json"))
  assert "eval step" not in r["log"]  # Not evaluated as if finished.
  # The source's missing MLM / NSP heads are none of the classifier's.
  assert "fresh: classifier." in r["log"]
  assert "Initialized fresh" not in r["log"]


@pytest.fixture(scope="module")
def finished(task, preempted):
  """The preempted run, rerun to a near end: resumes and finishes."""
  start = max(int(s) for s in os.listdir(os.path.join(preempted["workdir"],
                                                      "checkpoints")))
  # The preempted step depends on when the signal landed. End so that the
  # last log window (log_every=4: steps 4k+1 .. end) holds >= 2 steps: a
  # window of one step is its last batch's loss, and the test below could
  # not tell the two apart (e.g. preempted at 7, end 13: window [13, 13]).
  end = start + 6 + ((start + 6) % 4 == 1)
  config = _config(task, num_steps=end)
  results = finetuning.run(config, preempted["workdir"])
  return dict(config=config, results=results, start=start, end=end,
              workdir=preempted["workdir"])


@pytest.mark.slow
def test_rerun_finishes_with_a_window_mean_train_loss(finished):
  results, end = finished["results"], finished["end"]
  with open(os.path.join(finished["workdir"], "results.json")) as f:
    assert json.load(f) == results
  assert results["step"] == end
  with open(os.path.join(finished["workdir"], "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  last = [r for r in rows if r["split"] == "train"][-1]
  assert last["step"] == end
  # The mean of the steps since the previous log line (log_every=4), not the
  # last batch's loss.
  first = (end - 1) // 4 * 4 + 1
  assert results["train_loss_steps"] == [first, end]
  assert results["train_loss"] == pytest.approx(last["window_loss"])
  assert results["train_loss"] != pytest.approx(last["loss"])


def test_window_mean_skips_nonfinite_steps():
  window = [(np.float32(2.0), True), (np.float32(np.nan), False),
            (np.float32(4.0), True)]
  assert trainer_lib._window_loss(window, 12) == dict(
      window_loss=3.0, window_first_step=10, window_steps=2)


@pytest.mark.slow
def test_rerun_with_another_train_file_is_refused(task, finished):
  other = _write(task["base"] / "other.csv",
                 tiny_models.keyword_rows(64, seed=5))
  config = _config(task, num_steps=finished["config"].train.num_steps)
  config.task.train_file = other
  with pytest.raises(ValueError) as e:
    finetuning.run(config, finished["workdir"])
  msg = str(e.value)
  assert msg.startswith(f"{finished['workdir']} holds a checkpoint of another "
                        "task's data: it was fine-tuned with task.train_file="
                        f"{task['train']} (sha256 "), msg
  assert (f"this run gives {other} (sha256 " in msg and
          "--config.task.continue_with_new_files=True" in msg), msg
  # Told: it goes on from the checkpoint with the new file.
  config.task.continue_with_new_files = True
  assert finetuning.run(config, finished["workdir"])["step"] == (
      config.train.num_steps)


@pytest.mark.slow
def test_rerun_with_other_labels_names_the_label_map(task, finished):
  rows = [(text, {"pos": "good", "neg": "bad"}[label])
          for text, label in tiny_models.keyword_rows(32, seed=6)]
  config = _config(task, num_steps=finished["config"].train.num_steps)
  config.task.update(train_file=_write(task["base"] / "labels.csv", rows),
                     continue_with_new_files=True)
  label_map = os.path.join(finished["workdir"], "label_map.json")
  with pytest.raises(ValueError, match=(
      f"{label_map} maps the labels \\['neg', 'pos'\\] of the task this "
      "workdir was fine-tuned on, but .*labels.csv has other labels too "
      "\\(bad, good\\): a task with other labels needs a new --workdir.")):
    finetuning.run(config, finished["workdir"])


@pytest.mark.parametrize("case", ["empty_dev", "header_only_train",
                                  "label_names", "phases"])
def test_bad_setup_is_one_error_before_anything_is_written(task, tmp_path,
                                                           case):
  config = _config(task, num_steps=4)
  header_only = _write(tmp_path / "header.csv", [])
  expected = {
      "empty_dev": (f"The validation split (task.validation_file="
                    f"{header_only}) has no usable rows (it has no data "
                    "rows)."),
      "header_only_train": (f"Task file {header_only!r} holds no usable "
                            "labelled row (it has no data rows)."),
      "label_names": ("task.label_names=('a', 'b', 'c') names 3 classes, but "
                      "the task has 2 (labels neg, pos, in id order): give "
                      "one name per label, in that order."),
      "phases": ("train.phases / train.recipe apply to pretraining runs only "
                 "(a fine-tuning run's batches are its task's length "
                 "buckets, task.buckets); leave them empty."),
  }[case]
  if case == "empty_dev":
    config.task.validation_file = header_only
  elif case == "header_only_train":
    config.task.train_file = header_only
  elif case == "label_names":
    config.task.label_names = ("a", "b", "c")
  else:
    config.train.phases = (dict(num_steps=2, seq_length=32, batch_size=16,
                                max_predictions_per_seq=5),) * 2
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(workdir))
  assert str(e.value) == expected
  assert not workdir.exists()  # Not even the lock or the directory.


def _write_rows(path, fmt, rows):
  """rows [(text, label)] as CSV, TSV or JSONL with fields text, label."""
  with open(path, "w", newline="") as f:
    if fmt == "jsonl":
      f.writelines(json.dumps(dict(text=t, label=y)) + "\n" for t, y in rows)
    else:
      w = csv.writer(f, delimiter="\t" if fmt == "tsv" else ",")
      w.writerow(["text", "label"])
      w.writerows(rows)
  return str(path)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl"])
def test_training_data_of_a_single_label_is_refused(task, tmp_path, fmt,
                                                    caplog):
  """All 40 training rows say 'pos'; the validation file has 'pos', 'neg'
  and 'meh': one line naming the label and the validation rows of labels
  training lacks, before anything is written."""
  train = _write_rows(tmp_path / f"train.{fmt}", fmt,
                      [(f"good film {i}", "pos") for i in range(40)])
  dev = _write_rows(tmp_path / f"dev.{fmt}", fmt,
                    [("good", "pos"), ("bad", "neg"), ("so so", "meh"),
                     ("awful", "neg"), ("nice", "pos")])
  config = _config(task, num_steps=4)
  config.task.update(train_file=train, validation_file=dev)
  workdir = tmp_path / "run"
  with caplog.at_level("WARNING"), pytest.raises(ValueError) as e:
    finetuning.run(config, str(workdir))
  assert str(e.value) == (
      f"task.train_file={train}: training data has a single label 'pos' (40 "
      "rows), and a classifier needs two or more to tell apart (one label "
      "would give its head a single output, a regression's); 3 of the 5 "
      f"rows of task.validation_file={dev} carry labels the training data "
      "lacks. Give training rows of every label (or set "
      "task.regression=True for a numeric target).")
  assert not workdir.exists()  # Not even the lock or the directory.
  # The validation file's warning names the labels training lacks.
  assert ("unknown_label=3 (labels the training data lacks: meh, neg)"
          in caplog.text)


@pytest.mark.parametrize("case", ["missing", "gpt2", "not_a_checkpoint"])
def test_a_refused_init_from_names_the_field_first(task, tmp_path, case):
  """Every refusal of train.init_from starts with the field, as the docs
  quote them, before anything is written."""
  path = tmp_path / case
  if case == "gpt2":
    path.mkdir()
    (path / "config.json").write_text(json.dumps(
        {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    (path / "model.safetensors").write_bytes(b"")
  elif case == "not_a_checkpoint":
    path.mkdir()
    (path / "notes.txt").write_text("x")
  config = _config(task, num_steps=4)
  config.train.init_from = str(path)
  workdir = tmp_path / "run"
  with pytest.raises((ValueError, FileNotFoundError)) as e:
    finetuning.run(config, str(workdir))
  assert str(e.value).startswith(f"train.init_from: {path} "), str(e.value)
  assert len(str(e.value).splitlines()) == 1
  assert not workdir.exists()
