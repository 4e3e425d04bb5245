"""Averaging the parameters of chosen steps of one run into a new workdir.

ModernBERT's released weights average its annealing's best checkpoints with
the final one; others average the last few. `choose` picks the steps (given,
or the N best by a metric each step recorded: the held-out eval the trainer
ran at that step, ``meta["metrics"]["eval_step"]``, or a downstream sweep's
score, ``tools/eval_checkpoints.py``); `average` checks they belong together
(one run: one workdir; one objective; the same parameter shapes; the same
phase "model" fields) and returns the element-wise mean of their params
(or of the moving averages a run with train.ema_decay kept), accumulated in
float64 and stored as float32 (for two float32 steps: (a + b) / 2 in
float32, bit for bit); `write` makes a workdir holding that one step: its
params (no optimizer state: a start for export, fine-tuning or
``train.init_from``, not a run to resume), the run's config, the
provenance (`PROVENANCE` and ``meta["averaged"]``) and the run's tokenizer.
Every refusal is a ValueError (or FileNotFoundError) of one sentence,
raised before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import config_lib
from bert_jax.checkpoints import checks as checkpoint_checks
from bert_jax.checkpoints import reading

PROVENANCE = "averaged.json"
TOKENIZER_DIR = "tokenizer"


@dataclasses.dataclass(frozen=True)
class Choice:
  """The steps to average and why: the metric each was chosen by."""
  workdir: str
  steps: tuple[int, ...]
  by: str = ""  # The metric ("" when the steps were given).
  scores: tuple = ()  # (step, score) of the chosen steps, by `by`.
  # What of each step: its "params", or their moving average "ema"
  # (train.ema_decay).
  of: str = "params"


def lower_is_better(metric: str) -> bool:
  """Losses and perplexities are minimized, everything else maximized."""
  return "loss" in metric or "perplexity" in metric


def choose(workdir: str, steps=(), *, best: int = 0, by: str = "eval_loss",
           after_step: int = 0, include_last: bool = False,
           sweep: str = "") -> Choice:
  """`steps` of `workdir` (ints, or paths of step directories, which must
  be its own), or its `best` steps after `after_step` by `by`: the metric in
  each step's meta (recorded by an eval at that very step) or, with `sweep`
  (a checkpoint_sweep.json of this workdir), the sweep's rows. With
  `include_last` the newest step joins them."""
  workdir = reading.absolute(workdir)
  committed = reading.committed_steps(workdir)
  if bool(steps) == bool(best):
    raise ValueError("Give either --steps or --best N (with --by).")
  if steps:
    chosen = sorted({_own_step(workdir, s, committed) for s in steps})
    return Choice(workdir, tuple(chosen))
  scores = (_sweep_scores(workdir, sweep, by) if sweep else
            _meta_scores(workdir, committed, by))
  candidates = {s: v for s, v in scores.items() if s > after_step}
  if len(candidates) < best:
    where = (f"rows of {sweep}" if sweep else
             f"steps with their own {by} in their meta (an eval at the step "
             "itself: train.eval_every dividing checkpoint.save_every_steps)")
    raise ValueError(
        f"--best {best} --by {by}: only {len(candidates)} committed "
        f"{where} after step {after_step} in {workdir} "
        f"({sorted(candidates)}; committed: {committed}).")
  ranked = sorted(candidates, key=lambda s: (
      candidates[s] if lower_is_better(by) else -candidates[s], -s))
  chosen = set(ranked[:best]) | ({committed[-1]} if include_last else set())
  return Choice(workdir, tuple(sorted(chosen)), by, tuple(
      (s, candidates[s]) for s in sorted(chosen) if s in candidates))


def _own_step(workdir: str, step, committed: list[int]) -> int:
  """A --steps entry: a step of `workdir`, or a step directory in it."""
  if isinstance(step, str) and not step.strip().isdigit():
    step_dir, number = reading.resolve_step_dir(step)
    other = os.path.dirname(os.path.dirname(step_dir))
    if other != workdir:
      raise ValueError(
          f"--steps: {step_dir} is a step of another run ({other}), not of "
          f"{workdir}: average the steps of one run.")
    return number
  number = int(step)
  if number not in committed:
    raise FileNotFoundError(f"--steps: {number} is not a committed step of "
                            f"{workdir} (committed: {committed}).")
  return number


def _meta_scores(workdir: str, committed: list[int], by: str) -> dict:
  """{step: its `by`} for the steps whose meta holds an eval of themselves."""
  out = {}
  for step in committed:
    metrics = reading.read_meta(workdir, step).get("metrics") or {}
    if metrics.get("eval_step") == step and by in metrics:
      out[step] = float(metrics[by])
  return out


def _sweep_scores(workdir: str, path: str, by: str) -> dict:
  """{step: the row's `by`} of a tools/eval_checkpoints.py sweep of
  `workdir`."""
  with open(path) as f:
    sweep = json.load(f)
  if reading.absolute(sweep.get("workdir", "")) != workdir:
    raise ValueError(f"--sweep {path} swept {sweep.get('workdir')!r}, not "
                     f"{workdir}.")
  rows = sweep.get("rows") or []
  if rows and by not in rows[0]:
    raise ValueError(f"--by {by}: the rows of {path} hold "
                     f"{sorted(rows[0])}.")
  return {int(r["step"]): float(r[by]) for r in rows}


def average(choice: Choice) -> tuple[dict, dict]:
  """(mean params as float32 numpy, the newest chosen step's stored
  config) of `choice`; ValueError naming the steps when they do not belong
  together."""
  if not choice.steps:
    raise ValueError("No steps to average.")
  dirs = {s: reading.resolve_step_dir(choice.workdir, s)[0]
          for s in choice.steps}
  if choice.of != "params":
    for s, d in dirs.items():
      if choice.of not in reading.stored_state_tree(d):
        raise ValueError(f"Step {s} of {choice.workdir} holds no moving "
                         f"average ({choice.of!r}): its run had "
                         "train.ema_decay=0.")
  configs = {s: reading.stored_config(d) or {} for s, d in dirs.items()}
  first = choice.steps[0]
  for s in choice.steps[1:]:
    _check_same_kind(first, configs[first], s, configs[s])
    _check_same_shapes(first, dirs[first], s, dirs[s])
  total = tree = None
  for s in choice.steps:  # One step's params in memory at a time.
    tree, _, _ = reading.load_params(dirs[s], key=choice.of)
    flat = _flat(tree)
    total = total or {p: np.zeros(x.shape, np.float64)
                      for p, x in flat.items()}
    for p, x in flat.items():
      total[p] += np.asarray(x, np.float64)
  n = len(choice.steps)
  mean = {p: (v / n).astype(np.float32) for p, v in total.items()}
  bad = [p for p, v in mean.items() if not np.isfinite(v).all()]
  if bad:
    raise ValueError(f"The average of steps {list(choice.steps)} is not "
                     f"finite at {bad[0]}.")
  params = jax.tree_util.tree_map_with_path(
      lambda path, _: mean[checkpoint_checks.path_str(path)], tree)
  return params, configs[choice.steps[-1]]


def _flat(tree) -> dict:
  """{"a/b/0/kernel": leaf} of a params tree (arrays or stored metadata)."""
  return {checkpoint_checks.path_str(p): x
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _check_same_kind(a: int, config_a: dict, b: int, config_b: dict) -> None:
  """One objective, one family, the same phase "model" fields."""
  for field in ("name", "encoder"):
    x = (config_a.get("objective") or {}).get(field)
    y = (config_b.get("objective") or {}).get(field)
    if x != y:
      raise ValueError(f"Steps {a} and {b} were trained with different "
                       f"objectives (objective.{field} {x!r} and {y!r}): "
                       "average the steps of one run.")
  x = config_lib.phase_model_overrides(config_a, a)
  y = config_lib.phase_model_overrides(config_b, b)
  if x != y:
    raise ValueError(f"Steps {a} and {b} ran different model functions "
                     f"(their phases' model fields {x} and {y}): average "
                     "steps of one phase's model.")


def _check_same_shapes(a: int, dir_a: str, b: int, dir_b: str) -> None:
  shapes = [{p: tuple(getattr(m, "shape", ())) for p, m in
             _flat(reading.stored_params_tree(d)).items()}
            for d in (dir_a, dir_b)]
  for p in sorted(set(shapes[0]) | set(shapes[1])):
    x, y = shapes[0].get(p), shapes[1].get(p)
    if x != y:
      raise ValueError(f"Steps {a} and {b} hold different parameters: "
                       f"params/{p} is {x or 'absent'} in step {a} and "
                       f"{y or 'absent'} in step {b}.")


def check_output(output: str) -> None:
  """FileExistsError unless `output` is new (or an empty directory)."""
  path = epath.Path(output)
  if path.exists() and any(path.iterdir()):
    raise FileExistsError(f"--output {output} exists and is not empty; "
                          "write the average to a new directory.")


def write(output: str, choice: Choice, params: dict, config: dict) -> str:
  """The workdir `output`: checkpoints/<newest chosen step>/ with `params`
  and `config`, the provenance, and the run's tokenizer. Written beside it
  and renamed into place, so that a failure leaves no half-made workdir."""
  check_output(output)
  step = choice.steps[-1]
  provenance = dict(run=choice.workdir, steps=list(choice.steps),
                    of=choice.of, method="mean", by=choice.by or None,
                    scores={str(s): v for s, v in choice.scores})
  out = epath.Path(reading.absolute(output))
  tmp = out.parent / f"{out.name}.tmp-{os.getpid()}-{int(time.time())}"
  state = {"params": params}
  meta = dict(config=config, metrics={}, averaged=provenance,
              checksums=checkpoint_checks.digest_record(state))
  try:
    with ocp.CheckpointManager(
        os.fspath(tmp / "checkpoints"),
        options=ocp.CheckpointManagerOptions(create=True),
        item_handlers={reading.STATE: ocp.StandardCheckpointHandler(),
                       reading.META: ocp.JsonCheckpointHandler()}) as manager:
      manager.save(step, args=ocp.args.Composite(**{
          reading.STATE: ocp.args.StandardSave(state),
          reading.META: ocp.args.JsonSave(meta)}))
      manager.wait_until_finished()
    _copy_tree(epath.Path(choice.workdir) / TOKENIZER_DIR,
               tmp / TOKENIZER_DIR)
    (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=1) + "\n")
    if out.exists():
      out.rmdir()  # Empty (check_output).
    tmp.rename(out)
  finally:
    if tmp.exists():
      tmp.rmtree()
  return os.fspath(out)


def _copy_tree(source: epath.Path, target: epath.Path) -> None:
  """The files under `source` (the run's tokenizer) into `target`."""
  if not source.is_dir():
    return
  target.mkdir(parents=True, exist_ok=True)
  for f in source.iterdir():
    if f.is_dir():
      _copy_tree(f, target / f.name)
    else:
      f.copy(target / f.name)
