"""The task a fine-tuning workdir was trained on, recorded and compared.

A rerun resumes the workdir's checkpoint. With other training or validation
files it would go on training the same classifier on other data, reported
under the old task's name; with other labels it would read them through the
old ``label_map.json``. So a run records its task in ``WORKDIR/task.json``
(the task's name and settings, and each file's path and SHA-256), and a
rerun that would resume a checkpoint of another task is refused with one
line naming the difference. ``task.continue_with_new_files=True`` says that
new train / validation files are meant (the checkpoint goes on with them;
their labels must still be the ones in ``label_map.json``, which the task
reader checks). A workdir without a checkpoint has nothing to resume: its
record is simply rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os

TASK_FILE = "task.json"
# Settings that make it another task (no flag changes them on a checkpoint).
SETTINGS = ("name", "text_field", "text_pair_field", "label_field",
            "regression", "label_order", "tfds_data_dir")
# A token task's columns / fields; compared when the record has them (a
# record of an older run does not).
KIND_SETTINGS = ("kind", "tag_column", "tokens_field", "tags_field")
FILES = ("train_file", "validation_file")


def _gfile():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  (gs://)
  return tf.io.gfile


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with _gfile().GFile(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


def describe(config) -> dict:
  """The record of `config`'s task: its settings and its files."""
  t = config.task
  out = {k: t.get(k, "") for k in SETTINGS + KIND_SETTINGS}
  for k in FILES:
    path = t.get(k, "")
    path = path if not path or "://" in path else os.path.abspath(path)
    out[k] = dict(path=path, sha256=_sha256(path)) if path else None
  return out


def read(workdir: str) -> dict | None:
  path = os.path.join(workdir, TASK_FILE)
  if not _gfile().exists(path):
    return None
  with _gfile().GFile(path) as f:
    return json.load(f)


def write(workdir: str, record: dict) -> None:
  with _gfile().GFile(os.path.join(workdir, TASK_FILE), "w") as f:
    json.dump(record, f, indent=1)


def _file(entry) -> str:
  return "none" if not entry else (
      f"{entry['path']} (sha256 {entry['sha256'][:12]})")


def check(config, workdir: str, resumes: bool) -> dict:
  """The record of this run's task; ValueError naming the first difference
  when `workdir` holds a checkpoint (`resumes`) of another task."""
  new, old = describe(config), read(workdir)
  if old is None or not resumes:
    return new
  where = os.path.join(workdir, TASK_FILE)
  for k in SETTINGS + tuple(k for k in KIND_SETTINGS if k in old):
    if old.get(k, "") != new[k]:
      raise ValueError(
          f"{workdir} holds a checkpoint fine-tuned with task.{k}="
          f"{old.get(k, '')!r} ({where}); this run has task.{k}={new[k]!r}: "
          "another task needs a new --workdir.")
  if config.task.get("continue_with_new_files", False):
    return new
  for k in FILES:
    if old.get(k) != new[k]:
      same_path = bool(old.get(k) and new[k] and
                       old[k]["path"] == new[k]["path"])
      what = (f"task.{k}={new[k]['path']} has changed since it was "
              f"fine-tuned on it (sha256 {old[k]['sha256'][:12]} -> "
              f"{new[k]['sha256'][:12]})" if same_path else
              f"it was fine-tuned with task.{k}={_file(old.get(k))}, this "
              f"run gives {_file(new[k])}")
      raise ValueError(
          f"{workdir} holds a checkpoint of another task's data: {what} "
          f"({where}). Use a new --workdir, or pass "
          "--config.task.continue_with_new_files=True to go on from the "
          "checkpoint with these files.")
  return new
