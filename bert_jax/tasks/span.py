"""Extractive QA (SQuAD v1.1 / v2.0) as a fine-tuning task kind
(``task.kind="span"``).

Read (``data/squad_sources``: SQuAD JSON, TFDS ``squad/v1.1`` /
``squad/v2.0``), featurized with the checkpoint's tokenizer
(``data/span_features``: ``[CLS] q [SEP] context [SEP]`` windows with
character offsets), answered by ``span_answers`` (n-best spans over
windows, v2 null odds against ``task.null_score_diff_threshold``) and
scored by the official EM / F1 (``squad_metrics``). Each eval split writes
``predictions/<split>/predictions.json`` ({question id: answer text}),
``nbest_predictions.json`` (run_squad's: per question the n-best texts with
probability, start and end logit) and, for v2, ``null_odds.json``
({question id: null odds}): the official ``evaluate-v2.0.py DATA
predictions.json --na-prob-file null_odds.json --na-prob-thresh T`` (T =
``task.null_score_diff_threshold``) reads them unchanged.

The head gives two logits per position, the answer's start and end; the
loss of a window is (CE(start) + CE(end)) / 2 over its positions, as
google-research/bert's run_squad and Hugging Face's question-answering
classes; a window without the answer (or an unanswerable question) targets
[CLS], position 0. Padding positions are masked out of both softmaxes (a
large negative logit), so a window's loss does not depend on the bucket
length it is padded to; rows of ``example_weights`` 0 (padding rows of the
last eval batch) count nothing. Exported as the family's
``...ForQuestionAnswering``.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax import tasks
from bert_jax.data import feature_batches
from bert_jax.data import features
from bert_jax.data import span_features
from bert_jax.data import squad_sources
from bert_jax.models import heads
from bert_jax.objectives import safe_div
from bert_jax.tasks import span_answers
from bert_jax.tasks import squad_metrics

PADDING_LOGIT = -1e4  # Below any real logit, finite in every dtype.
PREDICTIONS_FILE = "predictions.json"
NULL_ODDS_FILE = "null_odds.json"
NBEST_FILE = "nbest_predictions.json"


def read(config, label_dir: str):
  """(task, train examples, {eval split: examples}). Nothing is written; an
  empty split is an error naming it."""
  del label_dir  # No label map: the head is always start / end.
  t = config.task
  if t.get("label_names"):
    raise ValueError(f"task.label_names={tuple(t.label_names)}: a span task "
                     "has no classes (the head marks an answer's start and "
                     "end); leave task.label_names empty.")
  task, rows = squad_sources.load_task(
      t.name, tfds_data_dir=t.tfds_data_dir, train_path=t.train_file,
      validation_path=t.validation_file)
  train = rows.pop(task.train_split)
  return task, train, rows


def save(workdir: str, task) -> None:
  """Nothing: a span task has no labels to map."""
  del workdir, task


def doc_stride(config) -> int:
  """task.doc_stride, or run_squad's 128 when 0."""
  return int(config.task.doc_stride) or 128


def feature_kwargs(config) -> dict:
  return dict(seq_length=config.data.seq_length,
              max_query_length=int(config.task.max_query_length),
              doc_stride=doc_stride(config))


class Input:
  """Train iterator (resumable) and per-split eval batches and span maps."""

  def __init__(self, config, tok, task, train, evals: dict):
    kw = feature_kwargs(config)
    lengths = feature_batches.bucket_lengths(config.data.seq_length,
                                             tuple(config.task.buckets))
    proc = dict(process_index=jax.process_index(),
                process_count=jax.process_count())
    pad_id = 0 if tok.pad_id is None else int(tok.pad_id)
    features, _ = span_features.build(train, tok, **kw)
    self.num_train = len(features)
    self.train_iter = feature_batches.FeatureIterator(
        features, batch_size=config.train.batch_size, seed=config.train.seed,
        lengths=lengths, pad_id=pad_id, **proc)
    self.data, self.span_maps, self.eval_splits = dict(evals), {}, {}
    for split, examples in evals.items():
      f, self.span_maps[split] = span_features.build(examples, tok, **kw)
      self.eval_splits[split] = feature_batches.eval_batches(
          f, batch_size=config.train.batch_size, lengths=lengths,
          pad_id=pad_id, **proc)
    self.eval_batches = [b for bs in self.eval_splits.values() for b in bs]

  def eval_extras(self) -> dict:
    return {}


def main_score(scores: dict) -> float:
  return float(scores["f1"])


def gold_answers(examples) -> dict:
  """{question id: [gold texts]} ([] for an unanswerable question)."""
  return {e.id: [text for text, _ in e.answers] for e in examples}


class Scorer:
  """Per eval split: logits -> answers -> official scores and the files."""

  def __init__(self, task: squad_sources.SpanTask, task_input: Input, config):
    self.task, self.input = task, task_input
    t = config.task
    self.options = dict(version_2=task.version_2,
                        n_best=int(t.n_best_size),
                        max_answer_length=int(t.max_answer_length),
                        null_threshold=float(t.null_score_diff_threshold))
    self.predicted: dict = {}  # {split: (predictions, null_odds, nbest)}
    self.details: dict = {}  # {split: counts, best thresholds}

  def score(self, split: str, batches: list) -> dict:
    """`batches`: [(feature index [B], {"start_logits", "end_logits"})]."""
    start, end = {}, {}
    for index, out in batches:
      s, e = np.asarray(out["start_logits"]), np.asarray(out["end_logits"])
      for row, f in enumerate(np.asarray(index)):
        if f >= 0:
          start[int(f)], end[int(f)] = s[row], e[row]
    examples = self.input.data[split]
    predictions, null_odds, nbest = span_answers.best_answers(
        examples, self.input.span_maps[split], start, end, **self.options)
    self.predicted[split] = (predictions, null_odds, nbest)
    scores, extras = squad_metrics.evaluate(
        gold_answers(examples), predictions, self.task.version_2,
        null_odds if self.task.version_2 else None,
        na_prob_thresh=self.options["null_threshold"])
    extras["null_score_diff_threshold"] = self.options["null_threshold"]
    self.details[split] = extras
    return scores

  def write(self, directory: str) -> list[str]:
    """predictions/<split>/predictions.json, nbest_predictions.json (and
    null_odds.json for v2)."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    paths = []
    for split, (predictions, null_odds, nbest) in self.predicted.items():
      d = os.path.join(directory, split)
      tf.io.gfile.makedirs(d)
      files = [(PREDICTIONS_FILE, predictions), (NBEST_FILE, nbest)]
      if self.task.version_2:
        files.append((NULL_ODDS_FILE, null_odds))
      for name, content in files:
        path = os.path.join(d, name)
        with tf.io.gfile.GFile(path, "w") as f:
          json.dump(content, f, indent=1, ensure_ascii=False)
        paths.append(path)
    return paths


# ==============================================================================
# The head's loss and metrics.
# ==============================================================================
def feature_spec(config):
  del config
  return features.SPAN_QA


def logits(model, batch, rng, deterministic: bool):
  """(start, end) logits [B, T] float32, padding positions masked."""
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  out = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
              deterministic=deterministic, rngs=rngs)
  real = batch["input_mask"] > 0
  return (jnp.where(real, out[..., 0], PADDING_LOGIT),
          jnp.where(real, out[..., 1], PADDING_LOGIT))


def _nll(logits_, positions):
  return -jnp.take_along_axis(jax.nn.log_softmax(logits_),
                              positions[:, None], axis=-1)[:, 0]


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  del config
  start, end = logits(model, batch, rng, deterministic)
  w = batch["example_weights"]
  s, e = batch["start_positions"], batch["end_positions"]
  nll = 0.5 * (_nll(start, s) + _nll(end, e))
  hit = (jnp.argmax(start, -1) == s) & (jnp.argmax(end, -1) == e)
  return dict(loss=jnp.sum(w * nll), examples=jnp.sum(w),
              span_correct=jnp.sum(w * hit))


def predict(model, batch, config) -> dict:
  """Start and end logits [B, T] (padding masked), no dropout."""
  del config
  start, end = logits(model, batch, None, True)
  return dict(start_logits=start, end_logits=end)


counts = tasks.example_counts
loss = tasks.mean_over_examples


def metrics(sums, counts_, config) -> dict:
  """Loss and the share of windows whose start and end argmax are right."""
  return dict(loss=loss(sums, counts_, config),
              span_accuracy=safe_div(sums["span_correct"],
                                     counts_["examples"]))


def validate(config) -> None:
  """A QA task's checks: the run's, and room in the sequence for the
  context beside the longest question (run_squad's max_seq_length >
  max_query_length + 3: [CLS] and two [SEP]); the answer search's sizes."""
  tasks.check_task_run(config)
  task = config.get("task")
  if task is None:  # The objective alone (tests, tools): no windows to check.
    return
  seq, query = int(config.data.seq_length), int(task.max_query_length)
  if query < 1:
    raise ValueError(f"task.max_query_length={query} must be >= 1.")
  if seq <= query + 3:
    raise ValueError(f"data.seq_length={seq} must exceed task.max_query_length"
                     f"={query} + 3 ([CLS] and two [SEP]) to leave room for "
                     "the context.")
  for field in ("n_best_size", "max_answer_length"):
    if int(task[field]) < 1:
      raise ValueError(f"task.{field}={task[field]} must be >= 1.")
  if int(task.doc_stride) < 0:
    raise ValueError(f"task.doc_stride={task.doc_stride} must be >= 1, or 0 "
                     "(run_squad's 128).")


def qa_fields(model_config, label_names=()) -> dict:
  """config.json entries of HF question answering: num_labels=2."""
  del model_config, label_names
  return dict(num_labels=2)  # HF sizes qa_outputs by num_labels: start, end.


KIND = tasks.Kind(
    name="span", objective="span_qa", role=heads.SPAN,
    output_name="qa_outputs", outputs=lambda mc: 2,
    hf_suffix="ForQuestionAnswering", outputs_are_labels=False,
    config_fields=qa_fields, feature_spec=feature_spec, loss_sums=loss_sums,
    counts=counts, loss=loss, metrics=metrics, predict=predict,
    log_keys=(("loss", "loss"), ("span_acc", "span_accuracy")),
    validate=validate, packing=False, read=read, save=save, make_input=Input,
    make_scorer=Scorer, main_score=main_score,
    tfds_tasks=tuple(squad_sources.TFDS_TASKS))
