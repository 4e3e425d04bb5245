"""Token tagging (NER) as a fine-tuning task kind (``task.kind="token"``).

Read (``data/token_sources``: CoNLL columns, JSONL, TFDS ``conll2003``),
featurized with the checkpoint's tokenizer (``data/token_features``: first
sub-token labelled, overlapping windows, every word predicted once), and
scored per word with conlleval's entity precision / recall / F1, micro and
per type, and token accuracy (``entity_metrics``). The predictions file of
each eval split is ``predictions/<split>/predictions.conll``: ``word gold
predicted`` per line and a blank line between sentences, which conlleval
reads unchanged.

The head gives ``model.num_labels`` tag logits at every position,
cross-entropy at the labelled ones: ``label_weights`` is 1 at the positions
whose tag is learned (a word's first sub-token in the window that owns it;
every sub-token with ``task.label_all_subtokens``) and 0 elsewhere ([CLS],
[SEP], padding, later sub-tokens, padding rows), so the loss is the mean
over labelled words of the whole global batch, whatever the mesh or bucket
length. Exported as the family's ``...ForTokenClassification``.

Batches are length-bucketed windows, or with ``data.packing`` packed rows
(``data/feature_packing``: several sentences' windows a row, attention
inside each, positions restarting; ``train.batch_size`` counts rows). The
windows are the same either way, so every word is still predicted once:
evaluation reads each packed window's logits back as a row of its own.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bert_jax import tasks
from bert_jax.data import feature_batches
from bert_jax.data import feature_packing
from bert_jax.data import features
from bert_jax.data import token_features
from bert_jax.data import token_sources
from bert_jax.models import heads
from bert_jax.objectives import safe_div
from bert_jax.tasks import entity_metrics
from bert_jax.tasks import sentence

PREDICTIONS_FILE = "predictions.conll"


def read(config, label_dir: str):
  """(task, train sentences, {eval split: sentences}): the tag set from
  label_dir/label_map.json (a resumed run), else from the training data;
  :func:`save` writes it after every check. Nothing is written here; an
  empty split is an error naming it."""
  t = config.task
  task, rows = token_sources.load_task(
      t.name, tfds_data_dir=t.tfds_data_dir, train_path=t.train_file,
      validation_path=t.validation_file, tag_column=t.tag_column,
      tokens_field=t.tokens_field, tags_field=t.tags_field,
      label_dir=label_dir, write_label_map=False)
  names = tuple(t.get("label_names") or ())
  if names and names != task.label_names:
    raise ValueError(
        f"task.label_names={names}: a token task's tags name themselves "
        f"({', '.join(task.label_names)}, in id order, saved as "
        "label_map.json); leave task.label_names empty.")
  train = rows.pop(task.train_split)
  return task, train, rows


def save(workdir: str, task) -> None:
  """The tag set's ids (label_map.json), kept by a resumed run."""
  token_sources.save_label_map(workdir, task.label_names)


def window_stride(config) -> int:
  """task.doc_stride, or half of the window (seq_length - 2) when 0."""
  return int(config.task.doc_stride) or max(1,
                                            (config.data.seq_length - 2) // 2)


class Input:
  """Train iterator (resumable) and per-split eval batches and word maps."""

  def __init__(self, config, tok, task, train, evals: dict):
    kw = dict(seq_length=config.data.seq_length,
              stride=window_stride(config),
              label_all_subtokens=bool(config.task.label_all_subtokens))
    lengths = feature_batches.bucket_lengths(config.data.seq_length,
                                             tuple(config.task.buckets))
    proc = dict(process_index=jax.process_index(),
                process_count=jax.process_count())
    pad_id = 0 if tok.pad_id is None else int(tok.pad_id)
    batch_size = config.train.batch_size
    features, _ = token_features.build(train, tok, task.label_names, **kw)
    if is_packed(config):  # train.batch_size counts packed rows.
      shape = feature_packing.Shape.from_config(config.data)
      self.num_train = feature_packing.rows_per_epoch(features, shape)
      self.train_iter = feature_packing.PackedFeatureIterator(
          features, batch_size=batch_size, seed=config.train.seed,
          shape=shape, pad_id=pad_id, **proc)
      batches = functools.partial(feature_packing.eval_batches, shape=shape)
    else:
      self.num_train = len(features)
      self.train_iter = feature_batches.FeatureIterator(
          features, batch_size=batch_size, seed=config.train.seed,
          lengths=lengths, pad_id=pad_id, **proc)
      batches = functools.partial(feature_batches.eval_batches,
                                  lengths=lengths)
    self.data, self.word_maps, self.eval_splits = dict(evals), {}, {}
    for split, sentences in evals.items():
      f, self.word_maps[split] = token_features.build(
          sentences, tok, task.label_names, **kw)
      self.eval_splits[split] = batches(f, batch_size=batch_size,
                                        pad_id=pad_id, **proc)
    self.eval_batches = [b for bs in self.eval_splits.values() for b in bs]

  def eval_extras(self) -> dict:
    return {}


def main_score(scores: dict) -> float:
  return float(scores["f1"])


class Scorer:
  """Per eval split: word predictions -> conlleval scores and the file."""

  def __init__(self, task, task_input: Input, config):
    del config
    self.task, self.input = task, task_input
    self.predicted: dict = {}  # {split: per sentence, predicted tags}
    self.details: dict = {}  # {split: per_type, entity / word counts}

  def score(self, split: str, batches: list) -> dict:
    """`batches`: [(feature index [B], {"logits": [B, T', labels]})]."""
    data = self.input.data[split]
    lengths = [len(w) for w in data.words]
    words = [np.full(n, -1, np.int64) for n in lengths]
    for index, out in batches:
      got = token_features.word_predictions(
          self.input.word_maps[split], index,
          np.asarray(out["logits"]).argmax(-1), lengths)
      for mine, new in zip(words, got):
        mine[new >= 0] = new[new >= 0]
    names = self.task.label_names
    missing = sum(int(np.sum(w < 0)) for w in words)
    if missing:
      raise AssertionError(f"{missing} words of {split} got no prediction.")
    pred = [[names[i] for i in w] for w in words]
    self.predicted[split] = pred
    s = entity_metrics.entity_scores(data.tags, pred)
    self.details[split] = {k: s[k] for k in ("per_type", "entities",
                                             "predicted", "words")}
    return {k: s[k] for k in ("precision", "recall", "f1", "accuracy")}

  def write(self, directory: str) -> list[str]:
    """predictions/<split>/predictions.conll for every scored split."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    paths = []
    for split, pred in self.predicted.items():
      data = self.input.data[split]
      d = os.path.join(directory, split)
      tf.io.gfile.makedirs(d)
      path = os.path.join(d, PREDICTIONS_FILE)
      with tf.io.gfile.GFile(path, "w") as f:
        f.write("\n".join(entity_metrics.conll_lines(data.words, data.tags,
                                                     pred)) + "\n")
      paths.append(path)
    return paths


# ==============================================================================
# The head's loss and metrics.
# ==============================================================================
def is_packed(config) -> bool:
  return bool(config.data.get("packing", False))


def feature_spec(config):
  return (features.PACKED_TOKEN_CLASSIFICATION if is_packed(config) else
          features.TOKEN_CLASSIFICATION)


def logits(model, batch, rng, deterministic: bool):
  """[B, T, num_labels] float32 (packed rows: each sequence's tokens see
  only their own sequence, at their own positions)."""
  rngs = None if deterministic else nnx.Rngs(dropout=rng)
  return model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
               deterministic=deterministic, rngs=rngs,
               **features.packed_inputs(batch))


def per_sequence(x, batch):
  """Packed rows' per-token outputs [B, T, ...] -> [B, S, T, ...]: slot s
  holds sequence s + 1's tokens from position 0 on (zeros after its end,
  and in an empty slot), as if it had a row of its own."""
  b, t = x.shape[:2]
  s = batch["cls_positions"].shape[-1]
  at = batch["cls_positions"][..., None] + jnp.arange(t)  # [B, S, T]
  flat = jnp.minimum(at, t - 1).reshape(b, s * t)
  owner = jnp.take_along_axis(batch["sequence_ids"], flat, axis=1)
  own = (owner.reshape(b, s, t) == jnp.arange(1, s + 1)[:, None]) & (at < t)
  got = jnp.take_along_axis(x, flat.reshape((b, s * t) + (1,) * (
      x.ndim - 2)), axis=1).reshape((b, s, t) + x.shape[2:])
  return jnp.where(own.reshape(own.shape + (1,) * (x.ndim - 2)), got, 0)


def loss_sums(model, batch, rng, deterministic: bool, config) -> dict:
  del config
  out = logits(model, batch, rng, deterministic)
  labels, w = batch["labels"], batch["label_weights"]
  nll = -jnp.take_along_axis(jax.nn.log_softmax(out), labels[..., None],
                             axis=-1)[..., 0]
  return dict(loss=jnp.sum(w * nll), tokens=jnp.sum(w),
              correct=jnp.sum(w * (jnp.argmax(out, -1) == labels)))


def predict(model, batch, config) -> dict:
  """Per-position tag logits [B, T, num_labels], no dropout; packed rows
  [B, S, T, num_labels], one row of logits per packed sequence
  (:func:`per_sequence`), so that they are scored like padded rows."""
  out = logits(model, batch, None, True)
  return dict(logits=per_sequence(out, batch) if is_packed(config) else out)


def counts(batch, config) -> dict:
  del config
  return dict(tokens=jnp.sum(batch["label_weights"]))


def loss(sums, counts_, config):
  del config
  return safe_div(sums["loss"], counts_["tokens"])


def metrics(sums, counts_, config) -> dict:
  return dict(loss=loss(sums, counts_, config),
              accuracy=safe_div(sums["correct"], counts_["tokens"]))


def validate(config) -> None:
  """A tagging task's checks: the run's, the head's and the windows over
  long sentences."""
  tasks.check_task_run(config)
  tasks.check_num_labels(config, "the tag set's size")
  task = config.get("task")
  if task is None:  # The objective alone (tests, tools): no windows to check.
    return
  window = int(config.data.seq_length) - 2  # [CLS] ... [SEP]
  if not 0 <= int(task.doc_stride) <= window:
    raise ValueError(f"task.doc_stride={task.doc_stride} must be between 1 and "
                     f"the window's {window} tokens (data.seq_length - 2), or "
                     "0 (half the window).")


def token_classification_fields(model_config, label_names=()) -> dict:
  """config.json entries of HF token classification: num_labels and
  id2label / label2id (the run's tag names, else LABEL_i)."""
  fields = sentence.classification_fields(model_config, label_names)
  fields.pop("problem_type")
  return fields


KIND = tasks.Kind(
    name="token", objective="token_classify", role=heads.TOKEN,
    output_name="classifier", outputs=lambda mc: int(mc.num_labels),
    hf_suffix="ForTokenClassification", outputs_are_labels=True,
    config_fields=token_classification_fields, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    predict=predict, log_keys=(("loss", "loss"), ("acc", "accuracy")),
    validate=validate, packing=True, read=read, save=save,
    make_input=Input, make_scorer=Scorer, main_score=main_score,
    tfds_tasks=tuple(token_sources.TFDS_TASKS))
