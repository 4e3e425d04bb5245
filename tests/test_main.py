"""`bert_jax.main` in process: the entry point a user runs, two tiny steps.

The fast tier's end-to-end check (as flax's lm1b `train_test.py`): the
command line is parsed by the entry point's own flag parser, the run writes
the demo corpus and trains a tokenizer in its workdir, takes two steps,
evaluates, commits a checkpoint and prints its last line. The subprocess
runs of the same command (resume, preemption, refusals) are in the slow tier.
"""

import json
import math
import os
import sys
import threading

import jax
import pytest
from absl import logging

from bert_jax import cli
from bert_jax import main as main_lib
from bert_jax.checkpoints import reading as checkpoint_reading
from tests import helpers


@pytest.fixture
def parsed_flags(monkeypatch):
  """Parse a command line with the entry point's parser; leave the process
  as it was (flags unparsed, hooks and log filters `cli.setup` installs
  removed)."""
  for module, name in ((threading, "excepthook"), (sys, "excepthook"),
                       (sys, "unraisablehook")):
    monkeypatch.setattr(module, name, getattr(module, name))
  handler = logging.get_absl_handler()
  filters = list(handler.filters)

  def parse(argv):
    monkeypatch.setattr(sys, "argv", argv)
    return cli.parse_flags(argv)

  # Two steps of a tiny model: compile fast rather than run fast.
  disabled = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield parse
  jax.config.update("jax_disable_most_optimizations", disabled)
  helpers.unparse_flags()
  handler.filters[:] = filters


def test_two_steps_log_finite_metrics_and_commit_a_checkpoint(
    parsed_flags, tmp_path, capsys):
  workdir = tmp_path / "run"
  parsed_flags([
      "bert_jax.main", "--config",
      os.path.join(helpers.REPO, "configs", "tiny.py"), "--workdir",
      f"file://{workdir}", *helpers.TINY_OVERRIDES,
      "--config.train.num_steps=2", "--config.train.log_every=1",
      "--config.train.eval_every=2", "--config.data.num_eval_batches=1",
      "--config.checkpoint.save_every_steps=2"])
  assert cli.FLAGS.workdir == str(workdir)  # file:// read as a local path.
  main_lib.main([])

  with open(workdir / "metrics.jsonl") as f:
    rows = [json.loads(line) for line in f]
  train = [r for r in rows if r["split"] == "train"]
  evals = [r for r in rows if r["split"] == "eval"]
  assert [r["step"] for r in train] == [1, 2]
  assert [r["step"] for r in evals] == [2]
  for r in train + evals:
    assert math.isfinite(r["loss"]) and r["loss"] > 0, r
    assert 0.0 <= r["mlm_accuracy"] <= 1.0, r
  assert checkpoint_reading.committed_steps(str(workdir)) == [2]
  out = capsys.readouterr().out
  assert f"final held-out MLM accuracy {evals[-1]['mlm_accuracy']:.4f}" in out
