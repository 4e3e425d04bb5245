r"""BERT, ELECTRA, ALBERT, DistilBERT and ModernBERT pretrained with equal
training FLOPs.

  python tools/family_efficiency.py --output /tmp/family_eff \
      --budget_pflops=0.025 [--families=bert,electra,albert,distil] \
      [--seeds=0,1,2] [--layers=12 --hidden=256 --embedding=128]
  python tools/family_efficiency.py --output /tmp/family_eff \
      --families=bert,modernbert     # ModernBERT against BERT

For each family: a config of comparable size on configs/demo.py's data
settings (demo corpus, seq 64, batch 32, 10 predictions, vocab 4,000), the
step count that spends the budget by ``compose.train_flops_per_step`` (the
objective's own count), a pretraining run (``python -m bert_jax.main``,
subprocess), its wall time and held-out metric from WORKDIR/metrics.jsonl,
then one fine-tuning per seed on the demo task (tools/make_demo_task.py;
``python -m bert_jax.finetune``, ELECTRA's discriminator). Prints one
Markdown table and writes OUT/family_efficiency.json.

Sizes: bert = L x H (E = H: our BertForPreTraining has no factorized
embeddings), electra = L x H discriminator with E and a 1/4-wide generator
(ELECTRA-Small at 12 x 256, E 128), albert = L x H, E, one shared block,
SOP, 3-gram masking, distil = an L/2-layer student of the bert row's trained
workdir (its FLOPs include the teacher's forward pass; the teacher's own
pretraining is not in its budget), modernbert = L x H with a GeGLU of
8H/3 (BERT's FFN parameters), 30% masking (20 predictions per 64 tokens),
no NSP, no dropout (its recipe), its 128-token window (wider than the demo's
64-token rows: every layer attends fully here). Every family: AdamW at
--learning_rate, warmup 10% of its steps, linear decay, float32; dropout
0.1 except ModernBERT's.

Rerunning with the same --output skips every finished run (a pretraining whose
final checkpoint exists, a fine-tuning with results.json) and resumes an
unfinished pretraining from its last checkpoint.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from absl import flags

from bert_jax import cli
from bert_jax import compose

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FAMILIES = ("bert", "electra", "albert", "distil", "modernbert")
RESULTS_FILE = "family_efficiency.json"
TASK = dict(name="pydoc_topics", text_field="text")

FLAGS = flags.FLAGS


def define_flags(flag_values, argv=None) -> None:
  """Flags of the command line only (tests import this module)."""
  del argv  # No --config here: the configs are configs/demo.py's.
  define = dict(flag_values=flag_values)
  cli.define_output("Output directory.", default="/tmp/family_eff",
                    aliases=("out",), **define)
  flags.DEFINE_float("budget_pflops", 0.025, "Training PFLOPs per family.",
                     **define)
  flags.DEFINE_list("families", list(FAMILIES), "Families, in run order.",
                    **define)
  flags.DEFINE_list("seeds", ["0", "1", "2"], "Fine-tuning seeds.", **define)
  flags.DEFINE_integer("layers", 12, "Encoder layers (the student: half).",
                       **define)
  flags.DEFINE_integer("hidden", 256, "Hidden size (heads of 64).", **define)
  flags.DEFINE_integer("embedding", 128, "E of ELECTRA and ALBERT.", **define)
  flags.DEFINE_float("learning_rate", 5e-4, "Pretraining peak learning rate.",
                     **define)
  flags.DEFINE_string("teacher", "", "DistilBERT's teacher workdir (default: "
                      "the bert row's).", **define)
  flags.DEFINE_integer("ft_epochs", 2, "Fine-tuning epochs.", **define)
  flags.DEFINE_float("ft_learning_rate", 1e-4, "Fine-tuning learning rate.",
                     **define)
  flags.DEFINE_bool("dry_run", False, "Print the plan (steps, FLOPs) only.",
                    **define)


# ==============================================================================
# Configs and budget (pure).
# ==============================================================================
def overrides(family: str, layers: int, hidden: int, embedding: int,
              teacher: str = "", teacher_tokenizer: str = "") -> dict:
  """configs/demo.py fields set for `family` ({dotted path: value})."""
  if family not in FAMILIES:
    raise ValueError(f"--families: {family!r} is not one of {FAMILIES}.")
  out = {"model.num_hidden_layers": layers, "model.hidden_size": hidden,
         "model.num_attention_heads": max(1, hidden // 64),
         "model.intermediate_size": 4 * hidden}
  if family == "electra":
    out.update({"objective.name": "electra", "model.embedding_size": embedding,
                # ELECTRA's masking: 85% [MASK], 15% kept; no sentence pairs.
                "data.mask_token_prob": 0.85, "data.random_token_prob": 0.0,
                "data.nsp": False})
  elif family == "albert":
    out.update({"objective.name": "albert", "model.embedding_size": embedding,
                "model.num_hidden_groups": 1, "model.inner_group_num": 1,
                "data.objective": "sop", "data.max_ngram": 3})
  elif family == "modernbert":
    out.update({"objective.name": "modernbert",
                "model.intermediate_size": 32 * round(8 * hidden / 3 / 32),
                "model.type_vocab_size": 0, "model.layer_norm_eps": 1e-5,
                "model.hidden_dropout_prob": 0.0,
                "model.attention_probs_dropout_prob": 0.0,
                "model.classifier_dropout_prob": 0.0,
                "data.mask_rate": 0.3, "data.max_predictions_per_seq": 20,
                "data.objective": "packed", "data.nsp": False})
  elif family == "distil":
    out.update({"objective.name": "distil", "objective.teacher": teacher,
                "objective.student_layers": max(1, layers // 2),
                "data.objective": "packed", "data.nsp": False,
                "data.tokenizer_path": teacher_tokenizer})
  return out


def demo_config(fields: dict):
  """configs/demo.py with `fields` applied (as --config.<path>= would)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location(
      "configs_demo", os.path.join(REPO, "configs", "demo.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  for path, value in fields.items():
    *groups, name = path.split(".")
    node = config
    for g in groups:
      node = node[g]
    node[name] = value
  return config


def steps_for_budget(flops_per_step: float, budget_flops: float) -> int:
  """The step count whose FLOPs come nearest the budget (>= 1)."""
  return max(1, int(round(budget_flops / flops_per_step)))


def trainable_params(config) -> int:
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from bert_jax.models import bert  # pylint: disable=g-import-not-at-top
  obj = compose.objective(config)
  return bert.count_params(nnx.eval_shape(
      lambda: obj.make_model(config, nnx.Rngs(0))))


def plan(family: str, budget_pflops: float, fields: dict,
         learning_rate: float) -> dict:
  """The run of `family`: its overrides with step count and schedule."""
  config = demo_config(fields)
  per_step = compose.train_flops_per_step(config)
  steps = steps_for_budget(per_step, budget_pflops * 1e15)
  m = config.model
  layers = (config.objective.student_layers if family == "distil"
            else m.num_hidden_layers)
  size = f"{layers} x {m.hidden_size}, E {m.embedding_size or m.hidden_size}"
  fields = dict(fields)
  fields.update({"train.num_steps": steps, "train.learning_rate":
                 learning_rate, "train.warmup_steps": max(1, steps // 10),
                 "train.log_every": 10, "train.eval_every": steps,
                 "checkpoint.save_every_steps": 100_000})
  return dict(family=family, size=size, params=trainable_params(config),
              flops_per_step=per_step, steps=steps,
              total_pflops=steps * per_step / 1e15, overrides=fields)


def cli_overrides(fields: dict) -> list[str]:
  return [f"--config.{k}={v}" for k, v in fields.items()]


# ==============================================================================
# Reading a run's results (pure).
# ==============================================================================
def read_pretraining(metrics_path: str, tokens_per_step: int) -> dict:
  """Held-out metric (last eval record) and median s/step of train records
  after the first (compile) from a run's metrics.jsonl."""
  records = [json.loads(line) for line in open(metrics_path) if line.strip()]
  evals = [r for r in records if r.get("split") == "eval"]
  speeds = [r["tokens_per_sec"] for r in records
            if r.get("split") == "train" and r.get("tokens_per_sec")][1:]
  last = evals[-1] if evals else {}
  if "disc_accuracy" in last:  # ELECTRA: all-"original" baseline.
    metric = dict(name="disc_acc", value=last["disc_accuracy"],
                  baseline=1.0 - last["replaced_share"],
                  gen_mlm_acc=last.get("mlm_accuracy"))
  else:
    metric = dict(name="mlm_acc", value=last.get("mlm_accuracy"),
                  baseline=last.get("unigram_accuracy"))
  return dict(eval_step=last.get("step"), metric=metric,
              s_per_step=(tokens_per_step / statistics.median(speeds)
                          if speeds else None))


def _fmt(x, spec: str) -> str:
  return "-" if x is None else format(x, spec)


def format_table(rows: list[dict]) -> str:
  """One Markdown row per family (missing results print as '-')."""
  lines = ["| family | layers x hidden, E | trainable params | GFLOP/step | "
           "steps | PFLOPs | s/step | pretraining wall | held-out metric "
           "(baseline) | dev acc per seed | median |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|---|---:|"]
  for r in rows:
    pre = r.get("pretraining") or {}
    m = pre.get("metric") or {}
    held = (f"{m['name']} {_fmt(m.get('value'), '.3f')} "
            f"({_fmt(m.get('baseline'), '.3f')})" if m else "-")
    scores = [100 * s for s in r.get("dev_scores", {}).values()]
    wall = pre.get("wall_s")
    lines.append(
        f"| {r['family']} | {r['size']} | {r['params']:,} | "
        f"{r['flops_per_step'] / 1e9:.1f} | {r['steps']} | "
        f"{r['total_pflops']:.4f} | {_fmt(pre.get('s_per_step'), '.2f')} | "
        f"{'-' if wall is None else f'{wall / 60:.1f} min'} | {held} | "
        f"{' / '.join(f'{s:.2f}' for s in scores) or '-'} | "
        f"{_fmt(statistics.median(scores) if scores else None, '.2f')} |")
  return "\n".join(lines)


# ==============================================================================
# Running (subprocesses; skips what is done).
# ==============================================================================
def _run(cmd: list[str], log_path: str) -> float:
  """Runs `cmd` in the repo root, output to `log_path`; wall seconds. One
  persistent XLA cache for every run (the seeds of a family compile once)."""
  env = dict(os.environ)
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
      os.path.dirname(os.path.dirname(log_path)), "xla_cache"))
  start = time.time()
  with open(log_path, "a") as log:
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=log,
                          stderr=subprocess.STDOUT, check=False)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd[:4])} ... failed (exit "
                       f"{proc.returncode}); see {log_path}.")
  return time.time() - start


def pretrain(row: dict, out: str) -> dict:
  workdir = os.path.join(out, "pretrain", row["family"])
  final = os.path.join(workdir, "checkpoints", str(row["steps"]))
  pre = dict(row.get("pretraining") or {}, workdir=workdir)
  if not os.path.isdir(final):
    os.makedirs(workdir, exist_ok=True)
    wall = _run([sys.executable, "-m", "bert_jax.main", "--config",
                 "configs/demo.py", "--workdir", workdir]
                + cli_overrides(row["overrides"]),
                os.path.join(out, "pretrain", f"{row['family']}.log"))
    # A resumed run adds its attempt's time to the earlier ones.
    pre["wall_s"] = pre.get("wall_s", 0.0) + wall
  config = demo_config(row["overrides"])
  pre.update(read_pretraining(os.path.join(workdir, "metrics.jsonl"),
                              config.data.seq_length * config.train.batch_size))
  return pre


def finetune(row: dict, out: str, seed: int, task_dir: str, epochs: int,
             learning_rate: float) -> float:
  workdir = os.path.join(out, "finetune", row["family"], f"seed{seed}")
  results = os.path.join(workdir, "results.json")
  if not os.path.isfile(results):
    os.makedirs(workdir, exist_ok=True)
    _run([sys.executable, "-m", "bert_jax.finetune", "--config",
          "configs/finetune.py", "--workdir", workdir,
          f"--config.task.name={TASK['name']}",
          f"--config.task.text_field={TASK['text_field']}",
          f"--config.task.train_file={task_dir}/train.csv",
          f"--config.task.validation_file={task_dir}/dev.csv",
          f"--config.train.init_from={row['pretraining']['workdir']}",
          "--config.data.seq_length=64", "--config.task.buckets=(16,32,64)",
          "--config.train.batch_size=32",
          f"--config.train.num_epochs={epochs}",
          f"--config.train.learning_rate={learning_rate}",
          f"--config.train.seed={seed}",
          "--config.checkpoint.save_every_steps=100000"],
         os.path.join(workdir, "finetune.log"))
  if not os.path.isfile(results):  # SIGTERM: a checkpoint, no results yet.
    raise RuntimeError(f"The fine-tuning in {workdir} stopped before it "
                       "finished (preempted); rerun the tool to resume it.")
  with open(results) as f:
    return float(json.load(f)["main_score"])


def _save(out: str, results: dict) -> None:
  with open(os.path.join(out, RESULTS_FILE) + ".tmp", "w") as f:
    json.dump(results, f, indent=1)
  os.replace(os.path.join(out, RESULTS_FILE) + ".tmp",
             os.path.join(out, RESULTS_FILE))


def main(argv):
  del argv
  out = os.path.abspath(FLAGS.output)
  os.makedirs(out, exist_ok=True)
  path = os.path.join(out, RESULTS_FILE)
  results = json.load(open(path)) if os.path.isfile(path) else {}
  results.update(budget_pflops=FLAGS.budget_pflops, seeds=FLAGS.seeds,
                 command=" ".join(sys.argv))
  rows = results.setdefault("rows", {})
  task_dir = os.path.join(out, "demo_task")
  if not FLAGS.dry_run and not os.path.isfile(f"{task_dir}/dev.csv"):
    _run([sys.executable, "tools/make_demo_task.py", "--output", task_dir],
         os.path.join(out, "demo_task.log"))
  for family in FLAGS.families:
    teacher, teacher_tok = FLAGS.teacher, ""
    if family == "distil":
      teacher = teacher or os.path.join(out, "pretrain", "bert")
      if not FLAGS.dry_run:
        from bert_jax import pretrained  # pylint: disable=g-import-not-at-top
        teacher_tok = pretrained.tokenizer_spec(teacher).path
    fields = overrides(family, FLAGS.layers, FLAGS.hidden, FLAGS.embedding,
                       teacher, teacher_tok)
    row = dict(rows.get(family, {}), **plan(
        family, FLAGS.budget_pflops, fields, FLAGS.learning_rate))
    rows[family] = row
    print(f"{family}: {row['size']}, {row['params']:,} params, "
          f"{row['flops_per_step'] / 1e9:.1f} GFLOP/step x {row['steps']} "
          f"steps = {row['total_pflops']:.4f} PFLOPs", flush=True)
    if FLAGS.dry_run:
      continue
    row["pretraining"] = pretrain(row, out)
    _save(out, results)
    scores = row.setdefault("dev_scores", {})
    for seed in FLAGS.seeds:
      scores[str(seed)] = finetune(row, out, int(seed), task_dir,
                                   FLAGS.ft_epochs, FLAGS.ft_learning_rate)
      _save(out, results)
  table = format_table([rows[f] for f in FLAGS.families if f in rows])
  results["table"] = table
  if not FLAGS.dry_run:
    _save(out, results)
  print(table)


if __name__ == "__main__":
  cli.run(main, define_flags)
