"""tools/eval_checkpoints.py: one fine-tuning per saved pretraining step."""

import csv
import json
import os
import random
import xml.etree.ElementTree as ET

import pytest

from tests import helpers
from tests.helpers import REPO
from tests.helpers import run_tool
from tests.helpers import tiny_models
from tests.helpers.checkpoints import random_params
from tests.helpers.checkpoints import save_checkpoints


def _tool():
  """The tool as a module (imported once: it defines absl flags)."""
  return helpers.import_tool("eval_checkpoints")


def _write_task(path, n, seed):
  """A keyword task over the tiny vocabulary: label = sentiment word."""
  r = random.Random(seed)
  filler = "the a it was this movie film story and very i we saw".split()
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text", "label"])
    for _ in range(n):
      pos = r.random() < 0.5
      words = [r.choice(filler) for _ in range(r.randint(3, 8))]
      words.insert(r.randint(0, len(words)),
                   r.choice(["great", "good"] if pos else ["bad", "awful"]))
      w.writerow([" ".join(words), "pos" if pos else "neg"])


def test_select_steps_counts_back_from_the_newest():
  tool = _tool()
  assert tool.select_steps([2, 4, 6, 8, 10], 1) == [2, 4, 6, 8, 10]
  assert tool.select_steps([2, 4, 6, 8, 10], 2) == [2, 6, 10]
  assert tool.select_steps([2, 4, 6, 8], 3) == [2, 8]
  with pytest.raises(ValueError, match="--every=0"):
    tool.select_steps([2], 0)


def test_svg_plot_is_valid_and_has_one_point_per_step():
  svg = _tool().svg_plot([2, 4, 8], [50.0, 60.0, 75.5], "a <task>")
  root = ET.fromstring(svg)
  ns = "{http://www.w3.org/2000/svg}"
  circles = root.findall(f"{ns}circle")
  assert [c.find(f"{ns}title").text for c in circles] == [
      "step 2: 50.00", "step 4: 60.00", "step 8: 75.50"]
  # Higher score is drawn higher (smaller y), the step axis left to right.
  ys = [float(c.get("cy")) for c in circles]
  xs = [float(c.get("cx")) for c in circles]
  assert ys[0] > ys[1] > ys[2] and xs[0] < xs[1] < xs[2]


@pytest.mark.slow
def test_sweep_fine_tunes_from_every_saved_step(tmp_path):
  base = tmp_path / "base"
  base.mkdir()
  vocab_path = str(base / "vocab.txt")
  vocab = tiny_models.write_vocab(vocab_path)
  config = tiny_models.tiny_model_config(len(vocab))
  config.data.tokenizer_path = vocab_path
  workdir = tmp_path / "pretrain"
  save_checkpoints(workdir, config, {
      s: random_params(config.model, seed=s) for s in (2, 4)})
  _write_task(tmp_path / "train.csv", 64, 0)
  _write_task(tmp_path / "dev.csv", 40, 1)
  out = tmp_path / "sweep"
  result = run_tool(
      "eval_checkpoints.py", "--config", os.path.join(REPO, "configs",
                                                      "finetune.py"),
      "--workdir", str(workdir), "--out", str(out),
      "--config.task.name=kw",
      f"--config.task.train_file={tmp_path / 'train.csv'}",
      f"--config.task.validation_file={tmp_path / 'dev.csv'}",
      "--config.task.text_field=text", "--config.task.buckets=(32,)",
      "--config.data.seq_length=32", "--config.train.batch_size=16",
      "--config.train.num_steps=3", "--config.train.learning_rate=1e-3")
  assert result.returncode == 0, result.stderr[-3000:]
  with open(out / "checkpoint_sweep.json") as f:
    sweep = json.load(f)
  assert sweep["saved_steps"] == [2, 4]
  assert [r["step"] for r in sweep["rows"]] == [2, 4]
  for r in sweep["rows"]:
    assert r["results"]["init_step"] == r["step"]
    assert (out / f"step_{r['step']}" / "results.json").is_file()
    assert 0.0 <= r["main_score"] <= 1.0
    assert r["scores"]["validation"]["accuracy"] == r["main_score"]
  # Different encoders, same fine-tuning recipe: the losses differ.
  losses = [r["results"]["train_loss"] for r in sweep["rows"]]
  assert losses[0] != losses[1]
  assert "main score (x100) by pretraining step" in result.stdout
  plots = [p for p in os.listdir(out) if p.startswith("checkpoint_sweep.")
           and p != "checkpoint_sweep.json"]
  assert len(plots) == 1 and os.path.getsize(out / plots[0]) > 200
