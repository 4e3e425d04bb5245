"""Fine-tune a checkpoint on a downstream task and evaluate it.

  python -m bert_jax.finetune --config configs/finetune.py \
      --config.task.name=glue/sst2 --config.task.tfds_data_dir=DIR \
      --config.train.init_from=PRETRAIN_WORKDIR --workdir OUT

`train.init_from` is anything `bert_jax.pretrained` resolves: a pretraining
workdir (latest step, or `--config.train.init_from_step`), a step directory,
an imported directory, a Hugging Face BERT directory or a Google TF
checkpoint. The encoder comes from there, the head is new. Training is the
pretraining `Trainer` (same mesh, sharding rules, optimizer, Orbax
checkpoints and exact resume) with the task kind's objective and bucketed
batches; evaluation runs over every validation example and writes the
task's official metrics to `OUT/results.json`, TensorBoard and a table, and
per-example predictions to `OUT/predictions/<split>/`.

Task kinds (`task.kind`, else from `task.name`; ``bert_jax/tasks/``):
  sentence  GLUE, CSV / TSV / JSONL: classification or regression
  token     CoNLL, JSONL, TFDS conll2003: NER tagging
  span      SQuAD v1.1 / v2.0 JSON or TFDS: extractive QA
  pairs     CSV / TSV / JSONL pairs, GLUE stsb / mrpc: sentence embeddings
            (configs/pairs.py)
Any kind's head goes on the checkpoint's family's encoder (BERT, ALBERT,
ELECTRA's discriminator, DistilBERT, ModernBERT: ``bert_jax/compose.py``),
laid out as that family's Hugging Face task class.

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

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import pretrained
from bert_jax import tasks
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.checkpoints import workdir_lock
from bert_jax.data import feature_batches
from bert_jax.data import tokenizers
from bert_jax.downstream import workdir_task
from bert_jax.hf import mapping
from bert_jax.tasks import sentence_metrics
from bert_jax.training import config_checks
from bert_jax.training import trainer as trainer_lib

RESULTS_FILE = "results.json"
PREDICTIONS_DIR = "predictions"
SWEEP_FILE = "sweep.json"
# Architecture fields taken from the checkpoint; the rest of `model`
# (dropout, dtype, attention kind) stays as this config sets it.
_KEEP_FROM_CONFIG = ("hidden_dropout_prob", "attention_probs_dropout_prob",
                     "dtype", "attention_impl", "fused_qkv", "remat_policy",
                     "num_labels")


# ==============================================================================
# Task kinds and config.
# ==============================================================================
DEFAULT_KIND = "sentence"


def task_kind(config) -> tasks.Kind:
  """The task kind of `config`: task.kind, or from task.name (a TFDS task
  of a kind, e.g. conll2003 -> token, squad/* -> span; else sentence)."""
  t = config.task
  named = next((k.name for k in tasks.all_kinds().values()
                if t.name in k.tfds_tasks), "")
  kind = t.get("kind", "") or named or DEFAULT_KIND
  if kind not in tasks.names():
    raise ValueError(f"task.kind={kind!r} must be one of "
                     f"{sorted(tasks.names())}.")
  if named and kind != named:
    raise ValueError(f"task.name={t.name!r} is a {named} task; task.kind="
                     f"{kind!r} contradicts it (leave task.kind empty).")
  return tasks.get(kind)


def check_packing(config, kind: tasks.Kind) -> None:
  """data.packing needs a kind that reads packed rows (sentence, token and
  pairs tasks); span windows are length-bucketed: one line refuses them before
  anything is read or written."""
  if config.data.get("packing", False) and not kind.packing:
    kinds = tasks.all_kinds().values()
    listed = lambda names: (", ".join(names[:-1]) + " and " + names[-1]
                            if len(names) > 1 else names[0])
    packed = listed([k.name for k in kinds if k.packing])
    bucketed = listed([k.name for k in kinds if not k.packing])
    raise ValueError(
        f"data.packing=True with task.kind={kind.name!r}: packed fine-tuning "
        f"rows hold {packed} tasks only; {bucketed} tasks batch their "
        "windows by length buckets: set data.packing=False.")


def read_task(config, label_dir: str):
  """(task, train rows, {eval split: rows}) of the config's task kind.
  Nothing is written; a resumed run's labels come from
  label_dir/label_map.json (the caller writes the map after its checks);
  an empty split is an error naming it."""
  return task_kind(config).read(config, label_dir)


def class_names(config, task) -> tuple[str, ...]:
  """The classes' names in id order: task.label_names, else the task's
  (a sentence task's labels, a token task's tags; a span task has none)."""
  return tuple(config.task.get("label_names") or ()) or tuple(
      getattr(task, "label_names", ()))


def task_input(config, tok, task, train, evals):
  """The kind's input: train_iter, eval_splits / eval_batches, num_train."""
  return task_kind(config).make_input(config, tok, task, train, evals)


def encoder_model_config(source):
  """The encoder the head goes on: the one the source's run holds
  (ELECTRA's discriminator, DistilBERT's student, a task run's own), with
  its family's pooler activation."""
  if source.config is None:  # No model config stored: one clear error.
    return pretrained.load_model_config(source)
  return compose.encoder_config(source.config)


def source_family(source) -> str:
  """The family of the source's encoder (a bare weights file: BERT)."""
  if source.config is None:
    return "bert"
  return compose.family(source.config).name


def resolve_config(config, source, task, num_train: int):
  """The run's full config: the checkpoint's architecture, the task kind's
  objective on the source's family's encoder (``objective.encoder``: the
  head's layout and export class follow it) and head width, and
  num_steps / warmup_steps derived from epochs (over `num_train` training
  rows or windows) when unset."""
  kind = task_kind(config)
  config = ml_collections.ConfigDict(config.to_dict())  # Unlocked copy.
  model = config_lib.complete_model(encoder_model_config(source).to_dict())
  for field in _KEEP_FROM_CONFIG:
    model[field] = config.model[field]
  model.update(kind.head_fields(config, model))
  model.num_labels = task.num_labels
  config.model = model
  config.objective.name = kind.objective
  config.objective.encoder = source_family(source)
  t = config.train
  if t.num_steps <= 0:
    t.num_steps = max(1, math.ceil(t.num_epochs * num_train / t.batch_size))
  if t.warmup_fraction > 0:
    t.warmup_steps = int(round(t.warmup_fraction * t.num_steps))
  return config


# ==============================================================================
# Evaluation: every validation example, the task's official metrics.
# ==============================================================================
class Evaluator:
  """Runs the model over each eval split; the task kind's Scorer turns the
  outputs into its official metrics (and keeps the predictions).

  Outputs and loss sums come from the trainer's predict step
  (`Trainer.predict`: the objective's `predict` and `loss_sums`), so the
  eval loss is the train step's loss over every real example or window."""

  def __init__(self, scorer, task_input, config):
    self.scorer, self.input, self.config = scorer, task_input, config
    self.scores: dict = {}  # {split: {metric: value}} of the last call.

  def __call__(self, trainer, params) -> dict:
    metrics, totals, index = {}, {}, 0
    for split, batches in self.input.eval_splits.items():
      collected = []
      for local in batches:
        sums, out = trainer.predict(params, local, index)
        index += 1  # The eval rng of the batch (deterministic steps: unused).
        totals = {k: totals.get(k, 0.0) + float(v) for k, v in sums.items()}
        collected.append(_slots(
            _global_rows(local[feature_batches.INDEX]), out))
      scores = self.scorer.score(split, collected)
      self.scores[split] = scores
      prefix = "" if len(self.input.eval_splits) == 1 else f"{split}/"
      metrics.update({prefix + k: v for k, v in scores.items()})
    # Sums added in float64 over every split, divided once (as pretraining's
    # eval): the loss over all real examples (windows, labelled words).
    objective = trainer.programs.objective
    metrics["loss"] = (float(objective.loss(totals, totals, self.config))
                       if totals else 0.0)
    return metrics


def _slots(index: np.ndarray, out: dict) -> tuple:
  """(example_index, outputs) with one entry per example: packed rows
  (data.packing: example_index [B, S], outputs [B, S, ...]) flattened to
  [B*S] / [B*S, ...] slots (an empty slot's index is -1); padded rows as
  they are."""
  if index.ndim == 1:
    return index, out
  flat = {k: np.asarray(v).reshape((-1,) + np.shape(v)[2:])
          for k, v in out.items()}
  return index.reshape(-1), flat


def _global_rows(local: np.ndarray) -> np.ndarray:
  """This host's rows of a global batch -> all rows (every process)."""
  if jax.process_count() == 1:
    return np.asarray(local)
  return np.asarray(multihost_utils.process_allgather(local, tiled=True))


# ==============================================================================
# One fine-tuning run.
# ==============================================================================
def _with_encoder(fresh_params, encoder, filled=frozenset()
                  ) -> tuple[dict, list[str]]:
  """Fresh params with the loaded encoder's entries that the task model
  has (a token / QA head's encoder has no pooler): `encoder` is
  {subtree: params} (the encoder, and a family's transform); returns what
  stayed fresh of those subtrees, and the kept entries holding a leaf in
  `filled` (ids of leaves the import made fresh)."""
  params = dict(jax.device_get(fresh_params))
  fresh = []
  for name, loaded in encoder.items():
    if name not in params:  # A transform the head does not have (embed).
      continue
    mine = dict(params[name])
    kept = {k: v for k, v in loaded.items() if k in mine}
    fresh += [f"{name}/{k}" for k in sorted(set(mine) - set(kept) | {
        k.split(".")[0] for k, v in mapping.flatten_params(kept).items()
        if id(v) in filled})]
    params[name] = {**mine, **kept}
  return params, fresh


def encoder_init(source, config, fresh_params, abstract_params):
  """Fresh params with the checkpoint's encoder in place, placed like
  `abstract_params` (the train state's, with their shardings): the head's
  output stays at its random init (reported), as in HF. The source's params
  are loaded as its run saved them (any family, any task run too) and its
  family takes the encoder out (``compose.encoder_params``: ELECTRA's
  discriminator, ALBERT's groups untied, ModernBERT's encoder and
  prediction head); entries the task model lacks (a pooler, for token and
  QA heads) are left out. `config` is the run's (resolve_config)."""
  loaded, report = pretrained.load_params(source, seed=config.train.seed)
  # What the head starts fresh: what the encoder lacks, and what the import
  # filled fresh and the encoder kept (a BertForMaskedLM's pooler). The
  # source's other fresh heads (a BertModel's MLM / NSP) are none of the
  # head's: not reported.
  filled = {id(v) for k, v in mapping.flatten_params(loaded).items()
            if any(k == h or k.startswith(h + ".") for h in report.fresh)}
  report.fresh = []
  encoder = (compose.encoder_params(source.config, loaded)
             if source.config is not None else {"bert": loaded["bert"]})
  params, fresh = _with_encoder(fresh_params, encoder, filled)
  logging.info("Encoder (%s run) from %s (%s); fresh: %s%s.",
               source.objective, source.path, report,
               ", ".join(sorted(k for k in params if k not in encoder)),
               "".join(f", {k}" for k in fresh))
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
  the results written to workdir/results.json (the eval splits'
  predictions files go to workdir/predictions/<split>/), or
  {"preempted_at_step": N} when a SIGTERM stopped it (a checkpoint of step
  N is committed; no results are written: rerun to finish)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if not config.train.init_from:
    raise ValueError("train.init_from is empty: name the checkpoint to "
                     "fine-tune (a workdir, step dir, HF or TF checkpoint).")
  kind = task_kind(config)
  check_packing(config, kind)
  try:
    source = pretrained.resolve(config.train.init_from,
                                config.train.init_from_step or None)
    tok_spec = pretrained.tokenizer_spec(source)
  except (ValueError, FileNotFoundError) as e:
    raise type(e)(f"train.init_from: {e}") from None
  # Static checks first (the step count is not known before the rows are
  # read, so check with the configured or a placeholder count).
  probe = ml_collections.ConfigDict(config.to_dict())
  probe.train.num_steps = max(1, probe.train.num_steps)
  probe.objective.update(name=kind.objective, encoder=source_family(source))
  config_checks.validate(probe, jax.device_count(), jax.process_count(),
                         check_sources=False)
  with workdir_lock.hold(workdir, take_over=take_over_workdir) as lock:
    # ---- Every check that reads the task, before this run writes a file.
    resumes = _resumes(workdir)  # Only a resumed run keeps its label map.
    task, train_rows, eval_rows = kind.read(config, workdir if resumes
                                            else "")
    tok = tokenizers.load(tok_spec.path, tok_spec.kind, tok_spec.lower_case)
    inputs = kind.make_input(config, tok, task, train_rows, eval_rows)
    config = resolve_config(config, source, task, inputs.num_train)
    phases = config_checks.validate(config, jax.device_count(),
                                    jax.process_count(), check_sources=False)
    config_checks.check_tokenizer(config, tok)
    task_record = workdir_task.check(config, workdir, resumes)
    # ---- The workdir's own files: what a rerun and an export read back.
    if jax.process_index() == 0:
      kind.save(workdir, task)  # label_map.json of string labels / tags
      workdir_task.write(workdir, task_record)
    pretrained.record_tokenizer(workdir, tok)  # What an export ships with.
    logging.info("Task %s: %d train rows (%d %s), eval %s; %d steps of "
                 "batch %d.", task.name, len(train_rows), inputs.num_train,
                 "packed rows" if config.data.get("packing", False) else
                 "examples" if kind.role == "pooled" else "features",
                 {k: len(v) for k, v in eval_rows.items()},
                 config.train.num_steps, config.train.batch_size)
    scorer = kind.make_scorer(task, inputs, config)
    evaluator = Evaluator(scorer, inputs, config)
    trainer = trainer_lib.Trainer(
        config, workdir, data=inputs,
        objective=compose.objective(config), evaluate=evaluator,
        init_params=lambda fresh, abstract: encoder_init(
            source, config, fresh, abstract), phases=phases)
    start = time.time()
    metrics = trainer_lib.run_trainer(trainer, lock)
    if "preempted_at_step" in metrics:  # Not finished: no final results.
      return {"preempted_at_step": metrics["preempted_at_step"]}
    if not evaluator.scores:  # Resumed after the end: evaluate once more.
      evaluator(trainer, trainer.final_state["params"])
    scores = evaluator.scores
    results = dict(
        task=task.name, kind=kind.name,
        init_from=source.path, init_step=source.step,
        step=int(config.train.num_steps), seconds=time.time() - start,
        learning_rate=config.train.learning_rate, seed=config.train.seed,
        label_names=list(class_names(config, task)), scores=scores,
        details=scorer.details,
        eval_examples={k: len(v) for k, v in eval_rows.items()},
        main_score=float(np.mean([kind.main_score(v)
                                  for v in scores.values()])),
        **_train_loss(metrics, workdir))
    if jax.process_index() == 0:
      results["predictions"] = [
          os.path.relpath(p, workdir) for p in scorer.write(
              os.path.join(workdir, PREDICTIONS_DIR))]
      with tf.io.gfile.GFile(os.path.join(workdir, RESULTS_FILE), "w") as f:
        json.dump(results, f, indent=1)
  print(sentence_metrics.format_table({task.name: scores}))
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
