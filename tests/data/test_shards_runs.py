"""Pre-tokenized shards end to end, through the commands:
``python -m bert_jax.pretokenize`` on text files, then ``python -m
bert_jax.main`` from the shards (in the text order, data.shard_order=
"files") killed with SIGKILL and rerun: every step it logged, before and
after the kill, has the loss of the run from the text files."""

import os
import signal
import subprocess
import sys

import pytest

from bert_jax.data import demo_corpus
from tests import helpers
from tests.helpers import REPO
from tests.helpers import TINY_OVERRIDES

SAVE_EVERY, NUM_STEPS, KILL_AT = 5, 12, 7
FLAGS = (*TINY_OVERRIDES, "--config.data.objective=packed",
         "--config.data.nsp=False", "--config.data.shard_order=files",
         "--config.data.block_lines=64", "--config.data.eval_fraction=0.1",
         f"--config.train.num_steps={NUM_STEPS}", "--config.train.log_every=1",
         "--config.train.eval_every=100000",
         f"--config.checkpoint.save_every_steps={SAVE_EVERY}",
         "--config.checkpoint.async_save=False")


def _main(workdir, *flags):
  return helpers.start_logged(
      workdir, "main", "--config", os.path.join(REPO, "configs", "tiny.py"),
      "--workdir", workdir, *FLAGS, *flags)


def _main_here(workdir, *flags) -> int:
  """`_main`'s command run to its end in this process: its exit status."""
  return helpers.run_main_logged(workdir, "tiny.py", *FLAGS, *flags,
                                 here=True)


@pytest.mark.slow
def test_run_from_shards_is_the_run_from_text_and_resumes_after_kill9(
    tmp_path):
  docs = [d for _, d in demo_corpus.demo_documents()]
  for k in range(3):
    demo_corpus.write_documents(str(tmp_path / f"part-{k}.txt"), docs[k::3])
  text = ",".join(str(tmp_path / f"part-{k}.txt") for k in range(3))
  shards = str(tmp_path / "shards")
  proc = subprocess.run(
      [sys.executable, "-m", "bert_jax.pretokenize", "--config",
       os.path.join(REPO, "configs", "tiny.py"), "--output", shards,
       "--workers", "2", *TINY_OVERRIDES, f"--config.data.sources={text}",
       "--config.data.block_lines=64"],
      cwd=REPO, env=helpers.child_env(), capture_output=True, text=True,
      timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.startswith(f"Wrote {shards}: 3 shards, "), proc.stdout
  tokenizer = os.path.join(shards, "tokenizer", "spm.model")
  assert os.path.isfile(tokenizer)

  from_text = str(tmp_path / "text")
  assert _main_here(from_text, f"--config.data.sources={text}",
                    f"--config.data.tokenizer_path={tokenizer}") == 0, (
                        helpers.run_log(from_text)[-3000:])
  want = {r["step"]: r["loss"] for r in helpers.train_records(from_text)}
  assert sorted(want) == list(range(1, NUM_STEPS + 1))

  workdir = str(tmp_path / "shards_run")
  flag = f"--config.data.sources=shards:{shards}"
  proc = _main(workdir, flag)
  helpers.wait_for_step(proc, workdir, KILL_AT)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait(timeout=60) == -signal.SIGKILL
  killed = helpers.train_records(workdir)
  assert max(r["step"] for r in killed) < 2 * SAVE_EVERY
  assert _main_here(workdir, flag) == 0, helpers.run_log(workdir)[-3000:]
  log = helpers.run_log(workdir)
  assert "Resumed from checkpoint step 5" in log, log[-3000:]
  resumed = helpers.train_records(workdir)[len(killed):]
  assert [r["step"] for r in resumed] == list(range(6, NUM_STEPS + 1))
  for r in killed + resumed:  # Bit for bit: the text run's losses.
    assert r["loss"] == want[r["step"]], (r["step"], r["loss"],
                                          want[r["step"]])
