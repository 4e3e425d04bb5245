r"""Downstream score against pretraining step: does more pretraining still pay?

  python tools/eval_checkpoints.py --workdir PRETRAIN_WORKDIR \
      --config configs/finetune.py [--every K] \
      --config.task.name=mytask --config.task.train_file=train.csv \
      --config.task.validation_file=dev.csv --config.task.text_field=text \
      --output OUT

Fine-tunes (bert_jax.finetune.run, the same config and seed every time) from
each committed checkpoint of the pretraining workdir, or from every K-th one
counted back from the newest (which is always included), in OUT/step_<S>/.
Prints step -> main score (the task's metrics averaged, x100), writes
OUT/checkpoint_sweep.json ({"rows": [{"step", "main_score", "scores",
"results"}]}) and a plot, OUT/checkpoint_sweep.png with matplotlib when it is
importable, else OUT/checkpoint_sweep.svg (written by hand, no dependency).
Rerunning resumes: a step whose fine-tuning finished is evaluated again from
its final checkpoint, not retrained. To average the best of them:
  python -m bert_jax.average --workdir PRETRAIN_WORKDIR --best 3 \
      --by main_score --sweep OUT/checkpoint_sweep.json --output AVG
"""

from __future__ import annotations

import json
import os
import sys

import ml_collections
from absl import flags

from bert_jax import cli
from bert_jax.checkpoints import reading as checkpoint_reading
from bert_jax.downstream import finetuning

SWEEP_FILE = "checkpoint_sweep.json"


def select_steps(steps: list[int], every: int) -> list[int]:
  """Every `every`-th of the saved `steps`, counted back from the newest."""
  if every < 1:
    raise ValueError(f"--every={every}: must be 1 or more.")
  return sorted(steps[::-1][::every])


def sweep_checkpoints(config, workdir: str, out: str, every: int = 1,
                      run=finetuning.run) -> dict:
  """One fine-tuning per selected step; returns (and writes) the sweep, or
  a preempted fine-tuning's {"preempted_at_step": N} (nothing written)."""
  steps = checkpoint_reading.committed_steps(workdir)
  if not steps:
    raise FileNotFoundError(f"{workdir} has no committed checkpoint step.")
  chosen = select_steps(steps, every)
  rows = []
  for step in chosen:
    c = ml_collections.ConfigDict(config.to_dict())
    c.train.init_from, c.train.init_from_step = workdir, step
    results = run(c, os.path.join(out, f"step_{step}"))
    if "preempted_at_step" in results:  # SIGTERM: rerun the tool to resume.
      return results
    rows.append(dict(step=step, main_score=results["main_score"],
                     scores=results["scores"], results=results))
  sweep = dict(workdir=os.path.abspath(workdir), task=rows[0]["results"][
      "task"], saved_steps=steps, rows=rows)
  os.makedirs(out, exist_ok=True)
  with open(os.path.join(out, SWEEP_FILE), "w") as f:
    json.dump(sweep, f, indent=1)
  return sweep


def format_table(sweep: dict) -> str:
  lines = [f"{sweep['task']}: main score (x100) by pretraining step",
           f"{'step':>10}  {'score':>7}  metrics"]
  for r in sweep["rows"]:
    metrics = " ".join(f"{s}/{k}={100 * v:.2f}" for s, d in r["scores"].items()
                       for k, v in d.items())
    lines.append(f"{r['step']:>10}  {100 * r['main_score']:7.2f}  {metrics}")
  return "\n".join(lines)


# ==============================================================================
# Plot: PNG through matplotlib when present, else a small SVG by hand.
# ==============================================================================
def write_plot(sweep: dict, out: str) -> str:
  steps = [r["step"] for r in sweep["rows"]]
  scores = [100 * r["main_score"] for r in sweep["rows"]]
  title = f"{sweep['task']}: fine-tuned score vs pretraining step"
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    path = os.path.join(out, "checkpoint_sweep.svg")
    with open(path, "w") as f:
      f.write(svg_plot(steps, scores, title))
    return path
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot(steps, scores, "o-")
  ax.set(xlabel="pretraining step", ylabel="main score (x100)", title=title)
  ax.grid(alpha=0.3)
  path = os.path.join(out, "checkpoint_sweep.png")
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return path


def svg_plot(xs, ys, title: str, width: int = 480, height: int = 320) -> str:
  """A line plot with labelled axis ends, as standalone SVG text."""
  left, right, top, bottom = 60, 20, 30, 40
  x0, x1 = min(xs), max(xs)
  y0, y1 = min(ys), max(ys)
  if x1 == x0:
    x0, x1 = x0 - 1, x1 + 1
  if y1 == y0:
    y0, y1 = y0 - 1, y1 + 1
  px = lambda x: left + (x - x0) / (x1 - x0) * (width - left - right)
  py = lambda y: height - bottom - (y - y0) / (y1 - y0) * (
      height - top - bottom)
  esc = lambda s: (str(s).replace("&", "&amp;").replace("<", "&lt;")
                   .replace(">", "&gt;"))
  points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, ys))
  ax_y = height - bottom
  parts = [
      f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" '
      f'height="{height}" font-family="sans-serif" font-size="11">',
      f'<rect width="{width}" height="{height}" fill="white"/>',
      f'<text x="{width / 2}" y="18" text-anchor="middle" font-size="13">'
      f"{esc(title)}</text>",
      f'<line x1="{left}" y1="{ax_y}" x2="{width - right}" y2="{ax_y}" '
      'stroke="black"/>',
      f'<line x1="{left}" y1="{top}" x2="{left}" y2="{ax_y}" stroke="black"/>',
      f'<text x="{left}" y="{ax_y + 15}" text-anchor="middle">{x0:g}</text>',
      f'<text x="{width - right}" y="{ax_y + 15}" text-anchor="middle">'
      f"{x1:g}</text>",
      f'<text x="{(left + width - right) / 2}" y="{height - 8}" '
      'text-anchor="middle">pretraining step</text>',
      f'<text x="{left - 5}" y="{ax_y}" text-anchor="end">{y0:.1f}</text>',
      f'<text x="{left - 5}" y="{top + 4}" text-anchor="end">{y1:.1f}</text>',
      f'<text x="14" y="{(top + ax_y) / 2}" text-anchor="middle" '
      f'transform="rotate(-90 14 {(top + ax_y) / 2})">main score (x100)'
      "</text>",
      f'<polyline points="{points}" fill="none" stroke="#1f77b4" '
      'stroke-width="2"/>',
  ]
  parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" '
            f'fill="#1f77b4"><title>step {x}: {y:.2f}</title></circle>'
            for x, y in zip(xs, ys)]
  return "\n".join(parts + ["</svg>"]) + "\n"


# ==============================================================================
# Command line.
# ==============================================================================
def define_flags(flag_values, argv=None) -> None:
  """A fine-tuning job's flags (--config: configs/finetune.py and its
  overrides), --workdir naming the pretraining run to sweep."""
  cli.define_job_flags(flag_values)
  flag_values["workdir"].help = "The pretraining workdir to sweep."
  cli.define_output("Output directory (one subdir per step).",
                    flag_values=flag_values, aliases=("out",))
  flags.DEFINE_integer("every", 1, "Every K-th saved step, newest included.",
                       flag_values=flag_values)


FLAGS = flags.FLAGS


def main(argv):
  del argv
  try:
    sweep = sweep_checkpoints(FLAGS.config, FLAGS.workdir, FLAGS.output,
                              FLAGS.every)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  if "preempted_at_step" in sweep:  # As a preempted fine-tuning: exit 0.
    print(f"preempted at step {sweep['preempted_at_step']}: checkpoint "
          "saved, no sweep yet; run the same command to resume.")
    return
  print(format_table(sweep))
  print(f"Wrote {os.path.join(FLAGS.output, SWEEP_FILE)} and "
        f"{write_plot(sweep, FLAGS.output)}")


if __name__ == "__main__":
  cli.run(main, define_flags)
