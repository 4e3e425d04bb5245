"""Sentence (pair) classification and regression as a fine-tuning task kind
(``task.kind="sentence"``, the default for GLUE and CSV / TSV / JSONL files).

Read by ``data/task_sources`` (GLUE from TFDS, the user's files with a
saved ``label_map.json``), batched in graph by ``data/task_data``
(``[CLS] A [SEP] B [SEP]``, length buckets, or with ``data.packing``
several examples a row, attention inside each), and scored with the task's
official metrics (``sentence_metrics``). Each eval split writes
``predictions/<split>/predictions.jsonl``: per example its row in the
source, text(s), gold label, predicted label and the class probabilities
(regression: gold and predicted value).

The head reads one vector per example (the family's pooled [CLS], or its
pooled tokens) and gives ``model.num_labels`` logits, cross-entropy; one
output is regression (STS-B), mean squared error, as in Hugging Face.
Packed rows hold several examples each: the head reads each example's own
vector and labels / weights are [B, S], 0 in empty slots. Rows with
``example_weights`` 0 pad the last eval batch of a bucket; they carry no
loss and no metric weight. Exported as the family's
``...ForSequenceClassification``.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax import tasks
from bert_jax.data import features
from bert_jax.data import task_sources
from bert_jax.models import heads
from bert_jax.objectives import safe_div
from bert_jax.tasks import sentence_metrics

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
  return sentence_metrics.main_score(scores)


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
    return sentence_metrics.task_scores(self.spec, rows.labels[index],
                                    sentence_metrics.predictions(out, self.spec))

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


# ==============================================================================
# The head's loss and metrics.
# ==============================================================================
def is_regression(config) -> bool:
  return config.model.num_labels == 1


def feature_spec(config):
  return features.classification_spec(is_regression(config),
                                      bool(config.data.get("packing", False)))


def logits(model, batch, rng, deterministic: bool):
  """[B, num_labels], or [B, S, num_labels] for packed rows."""
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  return model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
               deterministic=deterministic, rngs=rngs,
               **features.packed_inputs(batch))


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  out = logits(model, batch, rng, deterministic)
  w = batch["example_weights"]
  if is_regression(config):
    err = out[..., 0] - batch["labels"].astype(jnp.float32)
    return dict(loss=jnp.sum(w * err * err), examples=jnp.sum(w),
                correct=jnp.zeros((), jnp.float32))
  labels = batch["labels"]
  nll = -jnp.take_along_axis(jax.nn.log_softmax(out), labels[..., None],
                             axis=-1)[..., 0]
  return dict(loss=jnp.sum(w * nll), examples=jnp.sum(w),
              correct=jnp.sum(w * (jnp.argmax(out, -1) == labels)))


def predict(model, batch, config) -> dict:
  """Per-example logits [B, num_labels] (regression: [B, 1]; packed rows
  [B, S, ...], one per slot), no dropout."""
  del config
  return dict(logits=logits(model, batch, None, True))


counts = tasks.example_counts
loss = tasks.mean_over_examples


def metrics(sums, counts_, config) -> dict:
  out = dict(loss=loss(sums, counts_, config))
  if not is_regression(config):
    out["accuracy"] = safe_div(sums["correct"], counts_["examples"])
  return out


def validate(config) -> None:
  """A sentence task's checks: the run's and the head's."""
  tasks.check_task_run(config)
  tasks.check_num_labels(config, "1: regression")


def classification_fields(model_config, label_names=()) -> dict:
  """config.json entries of HF sequence classification: num_labels,
  id2label / label2id (the run's names, else LABEL_i) and problem_type
  (regression for one output, as HF infers it)."""
  n = int(model_config.num_labels)
  names = list(label_names) if len(label_names) == n else [
      f"LABEL_{i}" for i in range(n)]
  return dict(num_labels=n, id2label={str(i): x for i, x in enumerate(names)},
              label2id={x: i for i, x in enumerate(names)},
              problem_type="regression" if n == 1 else
              "single_label_classification")


KIND = tasks.Kind(
    name="sentence", objective="classify", role=heads.POOLED,
    output_name="classifier", outputs=lambda mc: int(mc.num_labels),
    hf_suffix="ForSequenceClassification", outputs_are_labels=True,
    config_fields=classification_fields, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    predict=predict, log_keys=(("loss", "loss"),), validate=validate,
    packing=True, read=read, save=save, make_input=Input, make_scorer=Scorer,
    main_score=main_score)
