"""Sentence (pair) classification and regression as a fine-tuning task kind
(``task.kind="sentence"``, the default for GLUE and CSV / TSV / JSONL files).

Read by ``data/task_sources`` (GLUE from TFDS, the user's files with a
saved ``label_map.json``), batched in graph by ``data/task_data``
(``[CLS] A [SEP] B [SEP]``, length buckets, or with ``data.packing``
several examples a row, attention inside each), trained with the ``classify``
objective and scored with the task's official metrics (``metrics``). Each
eval split writes ``predictions/<split>/predictions.jsonl``: per example its
row in the source, text(s), gold label, predicted label and the class
probabilities (regression: gold and predicted value).

The module gives ``finetuning`` the task-kind names (see ``token_tasks``).
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from bert_jax.data import task_sources
from bert_jax.downstream import metrics as task_metrics

KIND = "sentence"
OBJECTIVE = "classify"
PREDICTIONS_FILE = "predictions.jsonl"


def read(config, label_dir: str):
  """(task spec, train rows, {eval split: rows}). GLUE comes from
  task.tfds_data_dir; any other task.name reads the user's files, whose
  string labels are mapped once (label_dir/label_map.json when it holds a
  resumed run's map; :func:`save` writes it after every check). Nothing is
  written here; an empty split is an error naming it."""
  t = config.task
  user = not t.name.startswith("glue/")
  if user and not (t.train_file and t.validation_file):
    raise ValueError(f"task.name={t.name!r} is not a GLUE task, so it reads "
                     "your files: set task.train_file and "
                     "task.validation_file (CSV, TSV or JSONL).")
  spec, rows = task_sources.load_task(
      t.name, tfds_data_dir=t.tfds_data_dir, train_path=t.train_file,
      validation_path=t.validation_file,
      text_field=t.text_field if user else "",
      text_pair_field=t.text_pair_field, label_field=t.label_field,
      regression=t.regression, label_order=t.label_order, label_dir=label_dir,
      write_label_map=False)
  if user:
    check_several_labels(config, spec, rows)
  for split, split_rows in rows.items():
    field = "train_file" if split == spec.train_split else "validation_file"
    task_sources.check_not_empty(split, split_rows, (
        f"task.{field}={t[field]}" if user else
        f"{spec.name} in tfds_data_dir={t.tfds_data_dir!r}"))
  check_label_names(config, spec)
  train = rows.pop(spec.train_split)
  return spec, train, rows


def check_several_labels(config, spec, rows: dict) -> None:
  """A classifier needs two labels or more to tell apart: with one, its
  head has one output (a regression's) and the run either fails after its
  compile or scores 100% on rows of that label. Refused before anything is
  written, with how many validation rows carry labels training lacks."""
  if spec.regression or len(spec.label_names) != 1:
    return
  t = config.task
  train, dev = rows[spec.train_split], rows.get("validation")
  lacking = ""
  if dev is not None:
    other = int(dev.bad.get("unknown_label", 0))
    lacking = (f"; {other} of the {other + len(dev)} rows of "
               f"task.validation_file={t.validation_file} carry labels the "
               "training data lacks")
  raise ValueError(
      f"task.train_file={t.train_file}: training data has a single label "
      f"{spec.label_names[0]!r} ({len(train)} rows), and a classifier needs "
      "two or more to tell apart (one label would give its head a single "
      f"output, a regression's){lacking}. Give training rows of every label "
      "(or set task.regression=True for a numeric target).")


def check_label_names(config, spec) -> None:
  """task.label_names against the labels the files hold (before anything
  is written): one name per label, in id order."""
  names = tuple(config.task.get("label_names") or ())
  if names and len(names) != len(spec.label_names):
    raise ValueError(
        f"task.label_names={names} names {len(names)} classes, but the task "
        f"has {len(spec.label_names)}"
        + (f" (labels {', '.join(spec.label_names)}, in id order)"
           if spec.label_names else " (a regression)")
        + ": give one name per label, in that order.")


def save(workdir: str, spec) -> None:
  """The user's string labels' ids (label_map.json; GLUE's are TFDS's)."""
  if not spec.name.startswith("glue/") and not spec.regression:
    task_sources.save_label_map(workdir, spec.label_names)


class Input:
  """Train iterator (checkpointable) and per-split eval batches."""

  def __init__(self, config, tok, spec, train_rows, eval_rows: dict):
    del spec
    from bert_jax.data import packing  # TensorFlow: only when training.
    from bert_jax.data import task_data  # TensorFlow: only when training.
    proc = dict(process_index=jax.process_index(),
                process_count=jax.process_count())
    options = packing.PackingOptions.from_config(config.data)
    shape = dict(seq_length=config.data.seq_length,
                 buckets=tuple(config.task.buckets), packing=options)
    # What train.batch_size counts in an epoch: examples, or with
    # data.packing the packed rows they fill.
    self.num_train = len(train_rows) if options is None else (
        task_data.packed_rows_per_epoch(
            train_rows, tok, seq_length=config.data.seq_length,
            packing=options))
    self.data = dict(eval_rows)
    self.train_iter = task_data.create_train_iterator(
        train_rows, tok, batch_size=config.train.batch_size,
        seed=config.train.seed, **shape, **proc)
    self.eval_splits = {
        split: task_data.eval_batches(rows, tok, batch_size=config.train
                                      .batch_size, **shape, **proc)
        for split, rows in eval_rows.items()}
    self.eval_batches = [b for bs in self.eval_splits.values() for b in bs]

  def eval_extras(self) -> dict:
    return {}


def main_score(scores: dict) -> float:
  return task_metrics.main_score(scores)


def _softmax(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  return e / e.sum(axis=-1, keepdims=True)


class Scorer:
  """Per eval split: logits -> the task's metrics and the predictions."""

  def __init__(self, spec: task_sources.TaskSpec, task_input: Input, config):
    del config
    self.spec, self.input = spec, task_input
    self.predicted: dict = {}  # {split: (row positions, outputs [N, C])}
    self.details: dict = {}  # {split: {"examples": rows scored}}

  def score(self, split: str, batches: list) -> dict:
    """`batches`: [(row position [B] (-1: padding), {"logits": [B, C]})]
    (packed rows arrive flattened to one entry per slot)."""
    index = np.concatenate([np.asarray(i) for i, _ in batches] or [[]])
    index = index.astype(np.int64)
    outs = [np.asarray(o["logits"]) for _, o in batches]
    out = (np.concatenate(outs) if outs else
           np.zeros((0, self.spec.num_labels), np.float32))[index >= 0]
    index = index[index >= 0]
    rows = self.input.data[split]
    self.predicted[split] = (index, out)
    self.details[split] = dict(examples=int(len(index)))
    return task_metrics.task_scores(self.spec, rows.labels[index],
                                    task_metrics.predictions(out, self.spec))

  def records(self, split: str) -> list[dict]:
    """One dict per scored example, in source order."""
    index, out = self.predicted[split]
    rows, names = self.input.data[split], self.spec.label_names
    order = np.argsort(index, kind="stable")
    probs = None if self.spec.regression else _softmax(out)
    records = []
    for k in order:
      i = int(index[k])
      r = dict(index=int(rows.index[i]), text=str(rows.text_a[i]))
      if rows.text_b is not None:
        r["text_pair"] = str(rows.text_b[i])
      if self.spec.regression:
        r.update(label=float(rows.labels[i]), prediction=float(out[k, 0]))
      else:
        r.update(label=names[int(rows.labels[i])],
                 prediction=names[int(out[k].argmax())],
                 probabilities={n: float(p) for n, p in zip(names, probs[k])})
      records.append(r)
    return records

  def write(self, directory: str) -> list[str]:
    """predictions/<split>/predictions.jsonl for every scored split."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    paths = []
    for split in self.predicted:
      d = os.path.join(directory, split)
      tf.io.gfile.makedirs(d)
      path = os.path.join(d, PREDICTIONS_FILE)
      with tf.io.gfile.GFile(path, "w") as f:
        for r in self.records(split):
          f.write(json.dumps(r, ensure_ascii=False) + "\n")
      paths.append(path)
    return paths
