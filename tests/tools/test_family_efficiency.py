"""tools/family_efficiency.py's pure parts: the step count that spends the
budget, the per-family configs, reading metrics.jsonl and the table."""

import json

import pytest

from bert_jax import compose
from tests import helpers

FAMILIES = ("bert", "electra", "albert", "distil", "modernbert")


def tool():
  return helpers.import_tool("family_efficiency")


def _plan(family, budget_pflops=0.002):
  t = tool()
  fields = t.overrides(family, layers=2, hidden=64, embedding=32,
                       teacher="/teacher", teacher_tokenizer="/spm.model")
  return t.plan(family, budget_pflops, fields, learning_rate=5e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_steps_spend_the_budget_within_one_step(family):
  row = _plan(family)
  config = tool().demo_config(row["overrides"])
  per_step = compose.train_flops_per_step(config)
  assert row["flops_per_step"] == per_step
  assert abs(row["steps"] * per_step - 0.002e15) <= per_step / 2
  # The run trains that many steps, warms up 10% and evaluates at the end.
  assert config.train.num_steps == row["steps"] > 1
  assert config.train.warmup_steps == row["steps"] // 10
  assert config.train.eval_every == row["steps"]
  # Same data settings as configs/demo.py for every family (ModernBERT
  # predicts 30% of the tokens: 20 of 64).
  assert (config.data.seq_length, config.train.batch_size,
          config.data.max_predictions_per_seq) == (
              64, 32, 20 if family == "modernbert" else 10)


def test_families_differ_only_where_the_family_does():
  rows = {f: _plan(f) for f in FAMILIES}
  conf = {f: tool().demo_config(r["overrides"]) for f, r in rows.items()}
  assert conf["electra"].objective.name == "electra"
  assert conf["electra"].model.embedding_size == 32
  assert conf["albert"].model.num_hidden_groups == 1
  assert conf["distil"].objective.student_layers == 1
  assert conf["distil"].data.tokenizer_path == "/spm.model"
  # ALBERT shares its block: fewer parameters, about BERT's FLOPs.
  assert rows["albert"]["params"] < rows["bert"]["params"]
  # The student plus its teacher's forward cost less than BERT's step.
  assert rows["distil"]["flops_per_step"] < rows["bert"]["flops_per_step"]
  # ModernBERT: GeGLU of 8H/3 (here 160 = 32 x round(170.7 / 32)), MLM only
  # at 30%, within 10% of BERT's parameters (no position/segment tables).
  m = conf["modernbert"]
  assert (m.objective.name, m.model.intermediate_size, m.data.mask_rate,
          m.data.nsp) == ("modernbert", 160, 0.3, False)
  assert abs(rows["modernbert"]["params"] / rows["bert"]["params"] - 1) < 0.1
  with pytest.raises(ValueError, match="'gpt' is not one of"):
    tool().overrides("gpt", 2, 64, 32)


def test_reads_metrics_and_formats_the_table(tmp_path):
  path = tmp_path / "metrics.jsonl"
  records = [
      {"step": 10, "split": "train", "tokens_per_sec": 100.0},  # compile
      {"step": 20, "split": "train", "tokens_per_sec": 1000.0},
      {"step": 30, "split": "train", "tokens_per_sec": 2000.0},
      {"step": 30, "split": "eval", "disc_accuracy": 0.9,
       "replaced_share": 0.15, "mlm_accuracy": 0.05},
  ]
  path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
  pre = tool().read_pretraining(str(path), tokens_per_step=2048)
  assert pre["s_per_step"] == pytest.approx(2048 / 1500.0)
  assert pre["metric"]["name"] == "disc_acc"
  assert pre["metric"]["baseline"] == pytest.approx(0.85)
  row = dict(_plan("electra"), pretraining=dict(pre, wall_s=120.0),
             dev_scores={"0": 0.5, "1": 0.7, "2": 0.6})
  table = tool().format_table([row, _plan("bert")])
  lines = table.splitlines()
  assert len(lines) == 4 and lines[0].startswith("| family |")
  electra = lines[2].split("|")
  assert electra[1].strip() == "electra"
  assert electra[8].strip() == "2.0 min"
  assert electra[9].strip() == "disc_acc 0.900 (0.850)"
  assert electra[10].strip() == "50.00 / 70.00 / 60.00"
  assert electra[11].strip() == "60.00"  # Median over seeds.
  assert lines[3].split("|")[11].strip() == "-"  # Not run yet.
