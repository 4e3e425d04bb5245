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
from jax.experimental import multihost_utils

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax import pretrained
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.checkpoints import workdir_lock
from bert_jax.data import task_sources
from bert_jax.data import tokenizers
from bert_jax.downstream import metrics as task_metrics
from bert_jax.downstream import workdir_task
from bert_jax.hf import mapping
from bert_jax.objectives import classify
from bert_jax.training import config_checks
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
def read_task(config, label_dir: str):
  """(task spec, train rows, {eval split: rows}). GLUE comes from
  task.tfds_data_dir; any other task.name reads the user's files, whose
  string labels are mapped once (label_dir/label_map.json when it holds a
  resumed run's map; the caller writes the map after its checks). Nothing
  is written here; an empty split is an error naming it."""
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
  for split, split_rows in rows.items():
    field = "train_file" if split == spec.train_split else "validation_file"
    task_sources.check_not_empty(split, split_rows, (
        f"task.{field}={t[field]}" if user else
        f"{spec.name} in tfds_data_dir={t.tfds_data_dir!r}"))
  check_task(config, spec)
  train = rows.pop(spec.train_split)
  return spec, train, rows


def class_names(config, spec) -> tuple[str, ...]:
  """The classes' names in id order: task.label_names, else the labels."""
  return tuple(config.task.get("label_names") or ()) or spec.label_names


def check_task(config, spec) -> None:
  """The task's own settings against what the files hold (before anything
  is written)."""
  names = tuple(config.task.get("label_names") or ())
  if names and len(names) != len(spec.label_names):
    raise ValueError(
        f"task.label_names={names} names {len(names)} classes, but the task "
        f"has {len(spec.label_names)}"
        + (f" (labels {', '.join(spec.label_names)}, in id order)"
           if spec.label_names else " (a regression)")
        + ": give one name per label, in that order.")


def encoder_model_config(source):
  """The BertModel the classifier wraps: the objective's encoder config
  (ELECTRA's discriminator, DistilBERT's student) or the source's model."""
  if source.config is None:  # No model config stored: one clear error.
    return pretrained.load_model_config(source)
  return objectives.encoder_config(source.config)


def resolve_config(config, source, spec, num_train: int):
  """The run's full config: the checkpoint's architecture, the task's head
  width, and num_steps / warmup_steps derived from epochs when unset."""
  config = ml_collections.ConfigDict(config.to_dict())  # Unlocked copy.
  model = config_lib.complete_model(encoder_model_config(source).to_dict())
  for field in _KEEP_FROM_CONFIG:
    model[field] = config.model[field]
  model.num_labels = spec.num_labels
  config.model = model
  # The family's classifier (stored with the run: its export class).
  config.objective.name = finetune_objective(source).name
  # Whose encoder this is: the head's activation came with it
  # (model.pooler_act), and the export class follows it.
  config.objective.encoder = (objectives.encoder_name(source.config)
                              if source.config is not None else "bert")
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
  """Scores the classifier's predictions over each eval split.

  Logits and loss sums come from the trainer's predict step
  (`Trainer.predict`: the objective's `predict` and `loss_sums`), so the
  eval loss is the train step's loss over every real example."""

  def __init__(self, spec, task_input: TaskInput, config):
    self.spec, self.input, self.config = spec, task_input, config
    self.scores: dict = {}  # {split: {metric: value}} of the last call.
    self.examples: dict = {}  # {split: rows scored} (padding excluded).

  def __call__(self, trainer, params) -> dict:
    metrics, totals, index = {}, {}, 0
    for split, batches in self.input.eval_splits.items():
      outs, labels, weights = [], [], []
      for local in batches:
        sums, predicted = trainer.predict(params, local, index)
        index += 1
        totals = {k: totals.get(k, 0.0) + float(v) for k, v in sums.items()}
        # Packed rows: one prediction per slot ([B, S, ...] -> [B*S, ...]).
        out = np.asarray(predicted["logits"])
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
    # Sums added in float64 over every split, divided once (as pretraining's
    # eval): the loss over all real examples.
    metrics["loss"] = (float(classify.loss(totals, totals, self.config))
                       if totals else 0.0)
    return metrics


def _global_rows(local: np.ndarray) -> np.ndarray:
  """This host's rows of a global batch -> all rows (every process)."""
  if jax.process_count() == 1:
    return np.asarray(local)
  return np.asarray(multihost_utils.process_allgather(local, tiled=True))


# ==============================================================================
# One fine-tuning run.
# ==============================================================================
def finetune_objective(source):
  """The objective that fine-tunes `source`: its family's classifier
  (``Objective.finetune_objective``), else BERT's "classify"."""
  objective = objectives.get(source.objective)
  return objectives.get(objective.finetune_objective or "classify")


def encoder_init(source, config, fresh_params, abstract_params):
  """Fresh params with the checkpoint's encoder (`bert` subtree) in place,
  placed like `abstract_params` (the train state's, with their shardings):
  the classifier stays at its random init (reported), as in HF. The
  source's params are loaded as its run saved them (any family, an exported
  classifier of another task too) and the objective takes the encoder out;
  a family with its own classifier (ModernBERT, ``Objective.finetune_params``)
  says what that classifier takes over. `config` is the run's
  (resolve_config)."""
  objective = objectives.get(source.objective)
  if objective.finetune_params is not None:
    loaded, report = pretrained.load_params(
        source, pretrained.load_model_config(source), seed=config.train.seed)
    params = objective.finetune_params(loaded,
                                       dict(jax.device_get(fresh_params)))
    logging.info("Encoder (%s objective) from %s (%s).", objective.name,
                 source.path, report)
    return checkpoint_reading.place_params(params, abstract_params,
                                           source=source.path)
  loaded, report = pretrained.load_params(source, seed=config.train.seed)
  params = dict(jax.device_get(fresh_params))
  encoder = dict(objectives.encoder_params(loaded, source.config))
  # What the classifier starts fresh: what the encoder lacks, and what the
  # import filled fresh and the encoder kept (a BertForMaskedLM's pooler).
  # The source's other fresh heads (a BertModel's MLM / NSP) are none of
  # the classifier's: not reported.
  flat_loaded = mapping.flatten_params(loaded)
  filled = {id(v) for k, v in flat_loaded.items()
            if any(k == h or k.startswith(h + ".") for h in report.fresh)}
  fresh = set(params["bert"]) - set(encoder) | {
      k.split(".")[0] for k, v in mapping.flatten_params(encoder).items()
      if id(v) in filled}
  report.fresh = []
  params["bert"] = {**params["bert"], **encoder}
  logging.info("Encoder (%s objective) from %s (%s); fresh: classifier%s.",
               source.objective, source.path, report,
               "".join(f", bert/{k}" for k in sorted(fresh)))
  return checkpoint_reading.place_params(params, abstract_params,
                                         source=source.path)


def _resumes(workdir: str) -> bool:
  """Whether `workdir` holds a committed checkpoint (a rerun resumes it)."""
  try:
    return bool(checkpoint_reading.committed_steps(workdir))
  except FileNotFoundError:
    return False


def _train_loss(metrics: dict, workdir: str) -> dict:
  """results.json's train_loss: the mean per-step loss of the last log
  window (Trainer: the steps since the previous log line) and those steps.
  A run resumed after its end trains nothing: the last checkpoint's."""
  if "window_loss" not in metrics:
    steps = checkpoint_reading.committed_steps(workdir)
    metrics = checkpoint_reading.read_meta(workdir, steps[-1]).get(
        "metrics") or {}
  if "window_loss" not in metrics:
    return dict(train_loss=None, train_loss_steps=None)
  last = int(metrics["window_first_step"]) + int(metrics["window_steps"]) - 1
  return dict(train_loss=metrics["window_loss"],
              train_loss_steps=[int(metrics["window_first_step"]), last])


def run(config: ml_collections.ConfigDict, workdir: str, *,
        take_over_workdir: bool = False) -> dict:
  """Fine-tune per `config` in `workdir` (resuming) and evaluate; returns
  the results written to workdir/results.json, or
  {"preempted_at_step": N} when a SIGTERM stopped it (a checkpoint of step
  N is committed; no results are written: rerun to finish)."""
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
    # ---- Every check that reads the task, before this run writes a file.
    resumes = _resumes(workdir)  # Only a resumed run keeps its label map.
    spec, train_rows, eval_rows = read_task(config, workdir if resumes
                                            else "")
    tok = tokenizers.load(tok_spec.path, tok_spec.kind, tok_spec.lower_case)
    config = resolve_config(config, source, spec,
                            _train_units(config, train_rows, tok))
    phases = config_checks.validate(config, jax.device_count(),
                                    jax.process_count(), check_sources=False)
    config_checks.check_tokenizer(config, tok)
    task_record = workdir_task.check(config, workdir, resumes)
    # ---- The workdir's own files: what a rerun and an export read back.
    if jax.process_index() == 0:
      if not spec.name.startswith("glue/") and not spec.regression:
        task_sources.save_label_map(workdir, spec.label_names)
      workdir_task.write(workdir, task_record)
    pretrained.record_tokenizer(workdir, tok)
    logging.info("Task %s: %d train rows, eval %s; %d steps of batch %d.",
                 spec.name, len(train_rows),
                 {k: len(v) for k, v in eval_rows.items()},
                 config.train.num_steps, config.train.batch_size)
    task_input = TaskInput(config, tok, train_rows, eval_rows)
    evaluator = Evaluator(spec, task_input, config)
    trainer = trainer_lib.Trainer(
        config, workdir, data=task_input,
        objective=finetune_objective(source), evaluate=evaluator,
        init_params=lambda fresh, abstract: encoder_init(
            source, config, fresh, abstract), phases=phases)
    start = time.time()
    metrics = trainer_lib.run_trainer(trainer, lock)
    if "preempted_at_step" in metrics:  # Not finished: no final results.
      return {"preempted_at_step": metrics["preempted_at_step"]}
    if not evaluator.scores:  # Resumed after the end: evaluate once more.
      evaluator(trainer, trainer.final_state["params"])
    results = dict(
        task=spec.name, init_from=source.path, init_step=source.step,
        step=int(config.train.num_steps), seconds=time.time() - start,
        learning_rate=config.train.learning_rate, seed=config.train.seed,
        label_names=list(class_names(config, spec)),
        scores=evaluator.scores,
        eval_examples=evaluator.examples,
        main_score=task_metrics.main_score(
            {f"{s}/{k}": v for s, d in evaluator.scores.items()
             for k, v in d.items()}),
        **_train_loss(metrics, workdir))
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
      result = run(c, os.path.join(workdir, f"lr{lr:g}-seed{seed}"))
      if "preempted_at_step" in result:  # The rerun resumes this run.
        return result
      runs.append(result)
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
