"""downstream/workdir_task.py: a rerun that would resume a checkpoint of
another task is refused with one line naming the difference."""

import os

import ml_collections
import pytest

from bert_jax.downstream import workdir_task


def _config(train_file, validation_file, **task):
  return ml_collections.ConfigDict(dict(task=dict(
      dict(name="reviews", text_field="text", label_field="label",
           train_file=str(train_file), validation_file=str(validation_file)),
      **task)))


@pytest.fixture
def recorded(tmp_path):
  """A workdir whose task.json records the reviews task on two files."""
  train, dev = tmp_path / "train.csv", tmp_path / "dev.csv"
  train.write_text("text,label\ngood,pos\n")
  dev.write_text("text,label\nbad,neg\n")
  workdir = tmp_path / "run"
  workdir.mkdir()
  config = _config(train, dev)
  record = workdir_task.check(config, str(workdir), resumes=False)
  workdir_task.write(str(workdir), record)
  return dict(config=config, workdir=str(workdir), train=train, dev=dev,
              where=os.path.join(str(workdir), workdir_task.TASK_FILE))


def test_the_same_task_resumes_and_the_record_reads_back(recorded):
  record = workdir_task.check(recorded["config"], recorded["workdir"],
                              resumes=True)
  assert workdir_task.read(recorded["workdir"]) == record
  assert record["train_file"]["path"] == str(recorded["train"])
  assert len(record["train_file"]["sha256"]) == 64


def test_another_setting_is_refused_naming_the_field(recorded):
  config = _config(recorded["train"], recorded["dev"], text_field="review")
  with pytest.raises(ValueError) as e:
    workdir_task.check(config, recorded["workdir"], resumes=True)
  assert str(e.value) == (
      f"{recorded['workdir']} holds a checkpoint fine-tuned with "
      f"task.text_field='text' ({recorded['where']}); this run has "
      "task.text_field='review': another task needs a new --workdir.")


def test_an_edited_file_is_refused_unless_new_files_are_meant(recorded):
  recorded["train"].write_text("text,label\ngood,pos\nfine,pos\n")
  with pytest.raises(ValueError) as e:
    workdir_task.check(recorded["config"], recorded["workdir"], resumes=True)
  message = str(e.value)
  assert message.startswith(
      f"{recorded['workdir']} holds a checkpoint of another task's data: "
      f"task.train_file={recorded['train']} has changed since it was "
      "fine-tuned on it (sha256 ")
  assert message.endswith(
      f"({recorded['where']}). Use a new --workdir, or pass "
      "--config.task.continue_with_new_files=True to go on from the "
      "checkpoint with these files.")
  config = _config(recorded["train"], recorded["dev"],
                   continue_with_new_files=True)
  assert workdir_task.check(config, recorded["workdir"], resumes=True)[
      "train_file"]["sha256"] != workdir_task.read(recorded["workdir"])[
          "train_file"]["sha256"]


def test_another_file_is_named_with_both_paths(recorded, tmp_path):
  other = tmp_path / "dev2.csv"
  other.write_text("text,label\nbad,neg\n")  # Same bytes, another file.
  with pytest.raises(ValueError, match=(
      f"it was fine-tuned with task.validation_file={recorded['dev']} "
      r"\(sha256 [0-9a-f]{12}\), this run gives "
      f"{other} " r"\(sha256 [0-9a-f]{12}\)")):
    workdir_task.check(_config(recorded["train"], other), recorded["workdir"],
                       resumes=True)


def test_a_workdir_without_a_checkpoint_takes_any_task(recorded):
  config = _config(recorded["dev"], recorded["dev"], name="other")
  assert workdir_task.check(config, recorded["workdir"],
                            resumes=False)["name"] == "other"
