"""Where extractive-QA examples come from: SQuAD JSON files or TFDS.

Both give a list of :class:`QAExample` per split: question id, question,
context, gold answers as (text, character start) and whether the question
is unanswerable (SQuAD 2.0's ``is_impossible``).

* SQuAD JSON in the official format (``{"data": [{"paragraphs": [{"context",
  "qas": [{"id", "question", "answers": [{"text", "answer_start"}],
  "is_impossible"}]}]}]}``), v1.1 or v2.0: a file is 2.0 when its questions
  carry ``is_impossible``.
* TFDS ``squad/v1.1`` and ``squad/v2.0`` from a prepared ``tfds_data_dir``
  (splits train / validation).

Checked before anything is written (one ValueError naming the file and the
question): every answer's ``answer_start`` must point at its text in the
context (``context[start:start + len(text)] == text``), ids are unique, an
answerable question has an answer, and a split has questions.
"""

from __future__ import annotations

import dataclasses
import json

from bert_jax.data import task_sources

V1, V2 = "squad/v1.1", "squad/v2.0"
TFDS_TASKS = (V1, V2)


@dataclasses.dataclass(frozen=True)
class QAExample:
  id: str
  question: str
  context: str
  answers: tuple[tuple[str, int], ...]  # (text, character start)
  is_impossible: bool = False


@dataclasses.dataclass(frozen=True)
class SpanTask:
  """A QA task read: its name, whether it has unanswerable questions."""
  name: str
  version_2: bool
  eval_splits: tuple[str, ...] = ("validation",)
  train_split: str = "train"
  num_labels: int = 2  # The head's width: start and end.


def check_example(ex: QAExample, where: str) -> None:
  """ValueError naming the question when its answers do not fit."""
  if not ex.question.strip() or not ex.context.strip():
    raise ValueError(f"{where}: question {ex.id!r} has an empty question or "
                     "context.")
  if not ex.answers and not ex.is_impossible:
    raise ValueError(f"{where}: question {ex.id!r} has no answer and is not "
                     "marked is_impossible.")
  for text, start in ex.answers:
    found = ex.context[start:start + len(text)]
    if not text.strip() or start < 0 or found != text:
      raise ValueError(
          f"{where}: question {ex.id!r}: answer_start={start} points at "
          f"{found!r}, not at the answer text {text!r}.")


def _checked(examples: list[QAExample], where: str) -> list[QAExample]:
  seen = set()
  for ex in examples:
    if ex.id in seen:
      raise ValueError(f"{where}: question id {ex.id!r} appears twice.")
    seen.add(ex.id)
    check_example(ex, where)
  return examples


def read_json(path: str) -> tuple[list[QAExample], bool]:
  """An official SQuAD JSON file -> (examples, is SQuAD 2.0)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not tf.io.gfile.exists(path):
    raise FileNotFoundError(f"Task file {path!r} does not exist.")
  with tf.io.gfile.GFile(path, "rb") as f:
    try:
      data = json.loads(f.read().decode("utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{path} is not JSON ({e}).") from e
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    raise ValueError(f"{path} is not a SQuAD file: no top-level \"data\" "
                     "list of articles.")
  out, v2 = [], False
  try:
    for article in data["data"]:
      for para in article["paragraphs"]:
        context = para["context"]
        for qa in para["qas"]:
          v2 = v2 or "is_impossible" in qa
          impossible = bool(qa.get("is_impossible", False))
          answers = () if impossible else tuple(
              (a["text"], int(a["answer_start"])) for a in qa["answers"])
          out.append(QAExample(str(qa["id"]), qa["question"], context,
                               answers, impossible))
  except (KeyError, TypeError) as e:
    raise ValueError(f"{path} is not in the SQuAD format: missing or "
                     f"malformed field {e}.") from e
  return _checked(out, path), v2


def read_tfds(name: str, split: str, data_dir: str) -> list[QAExample]:
  """A prepared TFDS ``squad/v1.1`` or ``squad/v2.0`` split."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with task_sources.prepared_tfds(name, split, data_dir):
    ds = tfds.load(name, split=split, data_dir=data_dir or None,
                   download=False, shuffle_files=False,
                   read_config=tfds.ReadConfig(try_autocache=False))
  dec = lambda b: b.decode("utf-8") if isinstance(b, bytes) else str(b)
  out = []
  for ex in tfds.as_numpy(ds):
    impossible = bool(ex.get("is_impossible", False))
    answers = () if impossible else tuple(
        (dec(t), int(s)) for t, s in zip(ex["answers"]["text"],
                                         ex["answers"]["answer_start"]))
    out.append(QAExample(dec(ex["id"]), dec(ex["question"]),
                         dec(ex["context"]), answers, impossible))
  return _checked(out, f"tfds:{name}:{split}")


def load_task(name: str, *, tfds_data_dir: str = "", train_path: str = "",
              validation_path: str = ""
              ) -> tuple[SpanTask, dict[str, list[QAExample]]]:
  """``squad/v1.1`` / ``squad/v2.0`` from TFDS, or the user's SQuAD JSON
  files -> (task, {"train": [...], "validation": [...]})."""
  if name in TFDS_TASKS:
    rows = {s: read_tfds(name, s, tfds_data_dir)
            for s in ("train", "validation")}
    v2 = name == V2
    where = {s: f"{name} in tfds_data_dir={tfds_data_dir!r}" for s in rows}
  else:
    if not (train_path and validation_path):
      raise ValueError(f"task.name={name!r} is not a TFDS QA task "
                       f"({', '.join(TFDS_TASKS)}), so it reads your files: "
                       "set task.train_file and task.validation_file (SQuAD "
                       "JSON).")
    (train, v2_train), (dev, v2_dev) = (read_json(train_path),
                                        read_json(validation_path))
    rows, v2 = dict(train=train, validation=dev), v2_train or v2_dev
    where = dict(train=f"task.train_file={train_path}",
                 validation=f"task.validation_file={validation_path}")
  for split, examples in rows.items():
    if not examples:
      raise ValueError(f"The {split} split of task {name!r} ({where[split]}) "
                       "holds no question.")
  return SpanTask(name, v2), rows
