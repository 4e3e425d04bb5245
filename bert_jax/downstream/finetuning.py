"""Fine-tune a checkpoint on a downstream task and evaluate it.

  python -m bert_jax.finetune --config configs/finetune.py \
      --config.task.name=glue/sst2 --config.task.tfds_data_dir=DIR \
      --config.train.init_from=PRETRAIN_WORKDIR --workdir OUT

`train.init_from` is anything `bert_jax.pretrained` resolves: a pretraining
workdir (latest step, or `--config.train.init_from_step`), a step directory,
an imported directory, a Hugging Face BERT directory or a Google TF
checkpoint. The encoder comes from there, the classifier is new. Training is
the pretraining `Trainer` (same mesh, sharding rules, optimizer, Orbax
checkpoints and exact resume) with the `classify` objective and the task's
bucketed batches; evaluation runs over every validation example and writes
the task's official metrics to `OUT/results.json`, TensorBoard and a table.

`--sweep_learning_rates=2e-5,3e-5,5e-5 --sweep_seeds=0,1,2` runs one
fine-tuning per pair under OUT/lr<lr>-seed<seed>/ and reports, per task, the
median over seeds of the best learning rate (`OUT/sweep.json`).
"""

from __future__ import annotations

import json
import math
import os
import time

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx
from jax.experimental import multihost_utils

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax import pretrained
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.checkpoints import workdir_lock
from bert_jax.data import task_sources
from bert_jax.data import tokenizers
from bert_jax.downstream import metrics as task_metrics
from bert_jax.objectives import classify
from bert_jax.training import config_checks
from bert_jax.training import sharding
from bert_jax.training import trainer as trainer_lib

RESULTS_FILE = "results.json"
SWEEP_FILE = "sweep.json"
# Architecture fields taken from the checkpoint; the rest of `model`
# (dropout, dtype, attention kind) stays as this config sets it.
_KEEP_FROM_CONFIG = ("hidden_dropout_prob", "attention_probs_dropout_prob",
                     "dtype", "attention_impl", "fused_qkv", "remat_policy",
                     "num_labels")


# ==============================================================================
# Task and config.
# ==============================================================================
def read_task(config, workdir: str):
  """(task spec, train rows, {eval split: rows}). GLUE comes from
  task.tfds_data_dir; any other task.name reads the user's files, whose
  string labels are mapped once and saved as workdir/label_map.json."""
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
      regression=t.regression, label_order=t.label_order, label_dir=workdir)
  train = rows.pop(spec.train_split)
  return spec, train, rows


def source_objective(source):
  """(objective the source was trained with, its full run config or None).
  Sources without a stored objective (HF, TF, older runs) are BERT's."""
  stored = source.config
  name = ((stored.get("objective") or {}).get("name", "bert")
          if stored is not None else "bert")
  full = None
  if stored is not None and "model" in stored:
    full = config_lib.complete(stored)
    full.objective.update(stored.get("objective") or {})
  return objectives.get(name), full


def encoder_model_config(source):
  """The BertModel the classifier wraps: the objective's encoder config
  (ELECTRA's discriminator, DistilBERT's student) or the source's model."""
  objective, full = source_objective(source)
  if objective.encoder_config is not None and full is not None:
    return objective.encoder_config(full)
  return pretrained.load_model_config(source)


def resolve_config(config, source, spec, num_train: int):
  """The run's full config: the checkpoint's architecture, the task's head
  width, and num_steps / warmup_steps derived from epochs when unset."""
  config = ml_collections.ConfigDict(config.to_dict())  # Unlocked copy.
  model = config_lib.complete_model(encoder_model_config(source).to_dict())
  for field in _KEEP_FROM_CONFIG:
    model[field] = config.model[field]
  model.num_labels = spec.num_labels
  config.model = model
  if int(model.type_vocab_size) < 2:  # No segment table (DistilBERT).
    # Pretraining's sentence-pair setting is moot here; its check would
    # refuse the model.
    config.data.update(objective=config_lib.PACKED, nsp=False)
  t = config.train
  if t.num_steps <= 0:
    t.num_steps = max(1, math.ceil(t.num_epochs * num_train / t.batch_size))
  if t.warmup_fraction > 0:
    t.warmup_steps = int(round(t.warmup_fraction * t.num_steps))
  return config


# ==============================================================================
# Input: the task's bucketed batches, as the Trainer expects them.
# ==============================================================================
def _train_units(config, train_rows, tok) -> int:
  """What train.batch_size counts in one epoch: examples, or with
  data.packing the packed rows they fill."""
  from bert_jax.data import packing  # TensorFlow: only when training.
  from bert_jax.data import task_data  # TensorFlow: only when training.
  options = packing.PackingOptions.from_config(config.data)
  if options is None:
    return len(train_rows)
  return task_data.packed_rows_per_epoch(
      train_rows, tok, seq_length=config.data.seq_length, packing=options)


class TaskInput:
  """Train iterator (checkpointable) and per-split eval batches."""

  def __init__(self, config, tok, train_rows, eval_rows: dict):
    from bert_jax.data import task_data  # TensorFlow: only when training.
    proc = dict(process_index=jax.process_index(),
                process_count=jax.process_count())
    from bert_jax.data import packing  # TensorFlow: only when training.
    shape = dict(seq_length=config.data.seq_length,
                 buckets=tuple(config.task.buckets),
                 packing=packing.PackingOptions.from_config(config.data))
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


# ==============================================================================
# Evaluation: every validation example, the task's official metrics.
# ==============================================================================
class Evaluator:
  """Runs the classifier over each eval split and scores the predictions."""

  def __init__(self, spec, task_input: TaskInput, config):
    self.spec, self.input, self.config = spec, task_input, config
    self.scores: dict = {}  # {split: {metric: value}} of the last call.
    self.examples: dict = {}  # {split: rows scored} (padding excluded).
    self._predict = None

  def _predict_fn(self, trainer):
    if self._predict is None:
      p = trainer.programs

      def predict(params, batch):
        model = nnx.merge(p.graphdef, params)
        return classify.logits(model, batch, None, True)

      self._predict = jax.jit(
          predict, in_shardings=(p.state_sharding["params"], p.batch_sharding),
          out_shardings=sharding.replicated(p.mesh))
    return self._predict

  def __call__(self, trainer, params) -> dict:
    predict = self._predict_fn(trainer)
    names = trainer.programs.objective.feature_spec(self.config)
    metrics, total_loss, total_weight = {}, 0.0, 0.0
    for split, batches in self.input.eval_splits.items():
      outs, labels, weights = [], [], []
      for local in batches:
        model_in = {k: local[k] for k in names}
        batch = sharding.global_batch(model_in, trainer.batch_sharding)
        with trainer.programs.context():
          out = np.asarray(jax.device_get(predict(params, batch)))
        # Packed rows: one prediction per slot ([B, S, ...] -> [B*S, ...]).
        outs.append(out.reshape((-1, out.shape[-1])))
        labels.append(_global_rows(local["labels"]).reshape(-1))
        weights.append(_global_rows(local["example_weights"]).reshape(-1))
      out = np.concatenate(outs) if outs else np.zeros((0, 1), np.float32)
      y = np.concatenate(labels) if labels else np.zeros((0,))
      w = np.concatenate(weights) if weights else np.zeros((0,))
      scores = task_metrics.task_scores(
          self.spec, y, task_metrics.predictions(out, self.spec), w)
      self.scores[split] = scores
      self.examples[split] = int(round(float(w.sum())))
      prefix = "" if len(self.input.eval_splits) == 1 else f"{split}/"
      metrics.update({prefix + k: v for k, v in scores.items()})
      loss_sum, weight = _loss_sum(out, y, w, self.spec.regression)
      total_loss, total_weight = total_loss + loss_sum, total_weight + weight
    metrics["loss"] = total_loss / max(total_weight, 1.0)
    return metrics


def _global_rows(local: np.ndarray) -> np.ndarray:
  """This host's rows of a global batch -> all rows (every process)."""
  if jax.process_count() == 1:
    return np.asarray(local)
  return np.asarray(multihost_utils.process_allgather(local, tiled=True))


def _loss_sum(out, labels, weights, regression: bool) -> tuple[float, float]:
  """The objective's loss summed over real rows, in float64 on the host."""
  out = out.astype(np.float64)
  if regression:
    err = out[:, 0] - labels
    return float(np.sum(weights * err * err)), float(np.sum(weights))
  shifted = out - out.max(axis=-1, keepdims=True)
  logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
  nll = -logp[np.arange(len(labels)), labels.astype(np.int64)]
  return float(np.sum(weights * nll)), float(np.sum(weights))


# ==============================================================================
# One fine-tuning run.
# ==============================================================================
def encoder_init(source, trainer, fresh_params):
  """Fresh params with the checkpoint's encoder (`bert` subtree) in place:
  the classifier stays at its random init (reported), as in HF."""
  objective, full = source_objective(source)
  if objective.encoder_params is not None and full is not None:
    # Another family's tree (ELECTRA, ALBERT, DistilBERT): loaded as its
    # run saved it, the encoder taken out by the objective.
    loaded, report = pretrained.load_params(source, full.model, config=full)
    params = dict(jax.device_get(fresh_params))
    encoder = dict(objective.encoder_params(loaded, full))
    fresh = sorted(set(params["bert"]) - set(encoder))  # e.g. the pooler.
    params["bert"] = {**params["bert"], **encoder}
    logging.info("Encoder (%s objective) from %s (%s); fresh: classifier%s.",
                 objective.name, source.path, report,
                 "".join(f", bert/{k}" for k in fresh))
    return checkpoint_reading.place_params(
        params, trainer.abstract_state["params"], source=source.path)
  # Loaded with the source's own head width (an exported classifier of
  # another task loads too); only its encoder is kept.
  model_config = ml_collections.ConfigDict(trainer.config.model.to_dict())
  model_config.num_labels = pretrained.load_model_config(source).get(
      "num_labels", model_config.num_labels)
  loaded, report = pretrained.load_params(source, model_config,
                                          seed=trainer.config.train.seed)
  if "bert" not in loaded:
    raise ValueError(f"{source.path} holds no BERT encoder (no 'bert' params).")
  params = dict(jax.device_get(fresh_params))
  params["bert"] = loaded["bert"]
  logging.info("Encoder from %s (%s); classifier initialized fresh.",
               source.path, report)
  return checkpoint_reading.place_params(params, trainer.abstract_state["params"],
                                    source=source.path)


def run(config: ml_collections.ConfigDict, workdir: str, *,
        take_over_workdir: bool = False) -> dict:
  """Fine-tune per `config` in `workdir` (resuming) and evaluate; returns
  the results written to workdir/results.json."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not config.train.init_from:
    raise ValueError("train.init_from is empty: name the checkpoint to "
                     "fine-tune (a workdir, step dir, HF or TF checkpoint).")
  source = pretrained.resolve(config.train.init_from,
                              config.train.init_from_step or None)
  tok_spec = pretrained.tokenizer_spec(source)
  # Static checks first (the step count is not known before the rows are
  # read, so check with the configured or a placeholder count).
  probe = ml_collections.ConfigDict(config.to_dict())
  probe.train.num_steps = max(1, probe.train.num_steps)
  config_checks.validate(probe, jax.device_count(), jax.process_count(),
                         check_sources=False)
  with workdir_lock.hold(workdir, take_over=take_over_workdir) as lock:
    spec, train_rows, eval_rows = read_task(config, workdir)
    tok = tokenizers.load(tok_spec.path, tok_spec.kind, tok_spec.lower_case)
    config = resolve_config(config, source, spec,
                            _train_units(config, train_rows, tok))
    config_checks.validate(config, jax.device_count(), jax.process_count(),
                           check_sources=False)
    config_checks.check_tokenizer(config, tok)
    pretrained.record_tokenizer(workdir, tok)  # What an export ships with.
    logging.info("Task %s: %d train rows, eval %s; %d steps of batch %d.",
                 spec.name, len(train_rows),
                 {k: len(v) for k, v in eval_rows.items()},
                 config.train.num_steps, config.train.batch_size)
    task_input = TaskInput(config, tok, train_rows, eval_rows)
    evaluator = Evaluator(spec, task_input, config)
    trainer = trainer_lib.Trainer(
        config, workdir, data=task_input,
        objective=objectives.get("classify"), evaluate=evaluator,
        init_params=lambda t, fresh: encoder_init(source, t, fresh))
    start = time.time()
    metrics = trainer_lib.run_trainer(trainer, lock)
    if not evaluator.scores:  # Resumed after the end: evaluate once more.
      evaluator(trainer, trainer.final_state["params"])
    results = dict(
        task=spec.name, init_from=source.path, init_step=source.step,
        step=int(config.train.num_steps), seconds=time.time() - start,
        learning_rate=config.train.learning_rate, seed=config.train.seed,
        label_names=list(spec.label_names), scores=evaluator.scores,
        eval_examples=evaluator.examples,
        main_score=task_metrics.main_score(
            {f"{s}/{k}": v for s, d in evaluator.scores.items()
             for k, v in d.items()}),
        train_loss=metrics.get("loss"))
    if jax.process_index() == 0:
      with tf.io.gfile.GFile(os.path.join(workdir, RESULTS_FILE), "w") as f:
        json.dump(results, f, indent=1)
  print(task_metrics.format_table({spec.name: evaluator.scores}))
  return results


# ==============================================================================
# Sweep: learning rates x seeds, median over seeds of the best rate.
# ==============================================================================
def summarize_sweep(runs: list[dict]) -> dict:
  """{'by_lr': {lr: {'median': m, 'scores': [...]}}, 'best_lr', 'median'}."""
  by_lr: dict = {}
  for r in runs:
    by_lr.setdefault(r["learning_rate"], []).append(r["main_score"])
  table = {lr: dict(median=float(np.median(s)), scores=s)
           for lr, s in sorted(by_lr.items())}
  best = max(table, key=lambda lr: table[lr]["median"])
  return dict(by_lr=table, best_lr=best, median=table[best]["median"])


def sweep(config, workdir: str, learning_rates, seeds) -> dict:
  runs = []
  for lr in learning_rates:
    for seed in seeds:
      c = ml_collections.ConfigDict(config.to_dict())
      c.train.learning_rate, c.train.seed = float(lr), int(seed)
      runs.append(run(c, os.path.join(workdir, f"lr{lr:g}-seed{seed}")))
  summary = dict(task=runs[0]["task"], runs=runs, **summarize_sweep(runs))
  if jax.process_index() == 0:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    with tf.io.gfile.GFile(os.path.join(workdir, SWEEP_FILE), "w") as f:
      json.dump(summary, f, indent=1)
  print(f"{summary['task']}: median over seeds {list(seeds)} of the best "
        f"learning rate {summary['best_lr']:g}: "
        f"{100 * summary['median']:.2f}")
  for lr, row in summary["by_lr"].items():
    print(f"  lr {lr:g}: median {100 * row['median']:.2f}  runs "
          + " ".join(f"{100 * s:.2f}" for s in row["scores"]))
  return summary
