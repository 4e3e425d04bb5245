"""ELECTRA in the shared trainer: sharded like BERT, resumed exactly.

1. The same 3 ELECTRA train steps (sampling included) on 1 device and on
   DP=8, FSDP=8 and DP=2 x FSDP=2 x TP=2 simulated CPU devices give the same
   per-step loss within 1e-5 (dropout off). Runs in a child process that
   sees 8 devices (XLA_FLAGS set before jax is imported), as
   tests/training/test_sharding.py.
2. `python -m bert_jax.main --config configs/electra_small.py` (tiny
   overrides) killed with SIGKILL mid-run and started again logs exactly the
   per-step losses of an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests import helpers
from tests.helpers import REPO
from tests.helpers import child_env
from tests.helpers import in_process

pytestmark = pytest.mark.slow

TOL = 1e-5
STEPS = 3
RUNS = {"single": (1, 1, 1), "dp8": (8, 1, 1), "fsdp8": (1, 8, 1),
        "dp2_fsdp2_tp2": (2, 2, 2)}


# ------------------------------------------------------------------------------
# 1 vs 8 devices.
# ------------------------------------------------------------------------------
def child_main(out_path: str) -> None:
  import jax

  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  from tests.helpers.electra_batches import masked_batch
  from tests.helpers.electra_batches import tiny_electra_config
  assert jax.device_count() == 8, jax.devices()
  out = {}
  for name, shape in RUNS.items():
    config = tiny_electra_config()
    config.train.update(batch_size=16, num_steps=10, warmup_steps=1,
                        learning_rate=1e-3)
    config.mesh.update(data=shape[0], fsdp=shape[1], tensor=shape[2])
    mesh = sharding.make_mesh(config.mesh,
                              jax.devices()[:int(np.prod(shape))])
    programs = steps_lib.Programs(config, mesh)
    losses, replaced, mlm, disc = [], [], [], []
    with programs.context():
      state = programs.init()
      for step in range(STEPS):
        batch = sharding.global_batch(masked_batch(seed=step)[0],
                                      programs.batch_sharding)
        state, metrics = programs.train_step(state, batch)
        losses.append(float(metrics["loss"]))
        replaced.append(float(metrics["replaced_share"]))
        mlm.append(float(metrics["mlm_loss"]))
        disc.append(float(metrics["disc_loss"]))
    out[f"{name}/loss"] = np.array(losses)
    out[f"{name}/replaced"] = np.array(replaced)
    out[f"{name}/mlm_loss"] = np.array(mlm)
    out[f"{name}/disc_loss"] = np.array(disc)
    out[f"{name}/word_embeddings"] = np.asarray(jax.device_get(
        state["params"]["embeddings"]["word_embeddings"]))
  np.savez(out_path, **out)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("electra_sharding") / "runs.npz")
  env = child_env(devices=8)
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), "child",
                         path], env=env, cwd=REPO, capture_output=True,
                        text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-5000:]
  data = np.load(path)
  return {k: data[k] for k in data.files}


@pytest.mark.parametrize("name", ["dp8", "fsdp8", "dp2_fsdp2_tp2"])
def test_electra_mesh_matches_single_device(runs, name):
  ref = runs["single/loss"]
  assert ref.shape == (STEPS,) and np.all(np.isfinite(ref))
  assert len(set(np.round(ref, 4))) == STEPS  # It trains.
  print(f"{name}: per-step loss {runs[f'{name}/loss']} vs single {ref}, "
        f"max |diff| {np.max(np.abs(runs[f'{name}/loss'] - ref)):.2e}")
  # Each loss within 1e-5; the total (MLM + 50 x BCE, ~39 here, where one
  # float32 ulp is 4e-6) within 1e-5 relative.
  for part in ("mlm_loss", "disc_loss"):
    np.testing.assert_allclose(runs[f"{name}/{part}"], runs[f"single/{part}"],
                               rtol=0, atol=TOL)
  np.testing.assert_allclose(runs[f"{name}/loss"], ref, rtol=TOL, atol=0)
  # Same samples: the same share of tokens replaced.
  np.testing.assert_array_equal(runs[f"{name}/replaced"],
                                runs["single/replaced"])
  np.testing.assert_allclose(runs[f"{name}/word_embeddings"],
                             runs["single/word_embeddings"], rtol=0, atol=TOL)


# ------------------------------------------------------------------------------
# Exact resume after kill -9.
# ------------------------------------------------------------------------------
NUM_STEPS, SAVE_EVERY, KILL_AT = 30, 5, 12
FLAGS = ("--config.model.vocab_size=512", "--config.model.hidden_size=64",
         "--config.model.num_hidden_layers=2",
         "--config.model.num_attention_heads=4",
         "--config.model.intermediate_size=256",
         "--config.model.embedding_size=32",
         "--config.model.max_position_embeddings=64",
         "--config.data.tokenizer_vocab_size=512",
         "--config.data.seq_length=32",
         "--config.data.max_predictions_per_seq=5",
         "--config.data.num_eval_batches=1",
         "--config.train.batch_size=16", "--config.train.learning_rate=2e-3",
         "--config.train.warmup_steps=5", "--config.train.peak_tflops=1.0",
         f"--config.train.num_steps={NUM_STEPS}", "--config.train.log_every=1",
         "--config.train.eval_every=100000",
         f"--config.checkpoint.save_every_steps={SAVE_EVERY}")


def _start(workdir):
  return helpers.start_logged(
      str(workdir), "main", "--config",
      os.path.join(REPO, "configs", "electra_small.py"), "--workdir",
      str(workdir), *FLAGS)


def _run_here(workdir) -> int:
  """`_start`'s command run to its end in this process: its exit status."""
  return helpers.run_main_logged(str(workdir), "electra_small.py", *FLAGS,
                                 here=True)


def _losses(workdir) -> dict[int, float]:
  path = os.path.join(workdir, "metrics.jsonl")
  out = {}
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          r = json.loads(line)
        except ValueError:
          continue
        if r["split"] == "train":
          out[r["step"]] = r["loss"]  # A step redone after resume: last wins.
  return out


def test_electra_resumes_exactly_after_kill(tmp_path):
  ref_dir, run_dir = tmp_path / "reference", tmp_path / "killed"
  assert _run_here(ref_dir) == 0, open(f"{ref_dir}.log").read()[-3000:]
  reference = _losses(ref_dir)
  assert sorted(reference) == list(range(1, NUM_STEPS + 1))

  os.makedirs(run_dir)  # Same corpus and tokenizer files: no retraining.
  for name in os.listdir(ref_dir):
    if name.startswith(("tokenizer", "demo_corpus")):
      shutil.copytree(ref_dir / name, run_dir / name)
  proc = _start(run_dir)
  deadline = time.time() + 900
  while max(_losses(run_dir), default=0) < KILL_AT:
    assert proc.poll() is None, open(f"{run_dir}.log").read()[-3000:]
    assert time.time() < deadline
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = max(_losses(run_dir))
  assert killed_at < NUM_STEPS
  assert _run_here(run_dir) == 0, open(f"{run_dir}.log").read()[-3000:]
  log = open(f"{run_dir}.log").read()
  assert "Resumed from checkpoint step" in log
  resumed = _losses(run_dir)
  assert sorted(resumed) == list(range(1, NUM_STEPS + 1))
  assert resumed == reference  # Bit-exact, every step.


# ------------------------------------------------------------------------------
# A trained run: fill-mask in a fresh process, export, continue from the export.
# ------------------------------------------------------------------------------
CONFIG = ["--config", os.path.join(REPO, "configs", "electra_small.py")]
RUN_FLAGS = [f for f in FLAGS if "num_steps" not in f] + [
    "--config.train.num_steps=4"]


def _env():
  env = child_env()
  env.pop("XLA_FLAGS", None)
  return env


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
  """configs/electra_small.py shrunk (FLAGS), 4 steps: a workdir."""
  run = tmp_path_factory.mktemp("electra_run") / "run"
  proc = in_process.run_module("main", *CONFIG, "--workdir", str(run),
                               *RUN_FLAGS)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return run


def test_fill_mask_cli_on_the_workdir_in_a_fresh_process(trained_run):
  """The generator fills the mask; the family tables load on first use, not
  because some module happened to be imported before (else a fresh process
  prints "No Hugging Face table for model family 'electra_generator'")."""
  proc = subprocess.run(
      [sys.executable, "-m", "bert_jax.fill_mask", "--model",
       str(trained_run), "--top_k", "3", "--json",
       "the list of [MASK] is sorted."], cwd=REPO, env=_env(),
      capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = json.loads(proc.stdout.strip().splitlines()[-1])
  assert len(rows) == 3 and all("[MASK]" not in r["sequence"] for r in rows)
  scores = [r["score"] for r in rows]
  assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1


def test_export_run_to_hf_and_continue_pretraining_from_it(trained_run,
                                                           tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import jax.numpy as jnp
  from flax import nnx

  from bert_jax import pretrained
  from bert_jax.hf import mapping
  from tests.helpers.electra_batches import masked_batch
  env, run = _env(), trained_run
  out = tmp_path / "hf"
  proc = subprocess.run([sys.executable, "tools/convert_to_hf.py",
                         "--workdir", str(run), "--output", str(out)],
                        cwd=REPO, env=env, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for net in ("discriminator", "generator"):
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
      assert (out / net / name).is_file(), (net, name)

  # The export holds the checkpoint's params exactly, and PyTorch agrees.
  source = pretrained.resolve(str(run))
  params, _ = pretrained.load_params(source)
  back, report = pretrained.load_params(str(out),
                                        source.config.model)
  assert pretrained.resolve(str(out)).kind == pretrained.ELECTRA
  # The pair's tokenizer (fine-tuning from the pair reads it) is its halves'.
  assert pretrained.tokenizer_spec(str(out)).path == str(
      out / "discriminator" / "spiece.model")
  a, b = mapping.flatten_params(params), mapping.flatten_params(back)
  assert a.keys() == b.keys()
  assert all(np.array_equal(a[k], b[k]) for k in a), report
  from bert_jax.objectives import electra
  config = source.config
  graphdef, state = nnx.split(nnx.eval_shape(
      lambda: electra.make_model(config, nnx.Rngs(0))), nnx.Param)
  nnx.replace_by_pure_dict(state, params)
  model = nnx.merge(graphdef, state)
  batch, _ = masked_batch(seed=9, batch=2)
  args = [jnp.asarray(batch[k]) for k in ("input_ids", "input_mask",
                                          "segment_ids")]
  kw = dict(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
            attention_mask=torch.tensor(batch["input_mask"]),
            token_type_ids=torch.tensor(batch["segment_ids"],
                                        dtype=torch.long))
  real = batch["input_mask"].astype(bool)
  with torch.no_grad():
    d = transformers.ElectraForPreTraining.from_pretrained(
        out / "discriminator").eval()(**kw).logits.numpy()
    g = transformers.ElectraForMaskedLM.from_pretrained(
        out / "generator").eval()(**kw).logits.numpy()
  assert np.max(np.abs(d - np.asarray(model.discriminator_logits(*args)))[
      real]) < 1e-4
  assert np.max(np.abs(g - np.asarray(model.generator_logits(*args)))[
      real]) < 1e-4
  tok = transformers.AutoTokenizer.from_pretrained(out / "generator")
  assert tok.mask_token == "[MASK]"

  # bert_jax.fill_mask runs the generator, from the workdir or the export,
  # and agrees with transformers' fill-mask pipeline on the export.
  from bert_jax.downstream import mask_filling
  text = "the list of [MASK] is sorted."
  ours_run = mask_filling.fill_mask(str(run), text, top_k=3)
  ours_hf = mask_filling.fill_mask(str(out), text, top_k=3)
  theirs = transformers.pipeline("fill-mask", model=str(out / "generator"),
                                 top_k=3)(text)
  assert [r["token"] for r in ours_run] == [r["token"] for r in ours_hf] == [
      r["token"] for r in theirs]
  np.testing.assert_allclose([r["score"] for r in ours_hf],
                             [r["score"] for r in theirs], atol=1e-5)

  # Continue pretraining from the Hugging Face pair (train.init_from).
  proc = in_process.run_module(
      "main", *CONFIG, "--workdir", str(tmp_path / "continued"), *RUN_FLAGS,
      f"--config.train.init_from={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "train.init_from: params of" in proc.stderr
  assert "ElectraForPreTraining + ElectraForMaskedLM" in proc.stderr


if __name__ == "__main__":
  if sys.argv[1] == "child":
    child_main(sys.argv[2])
  else:
    raise SystemExit(f"unknown mode {sys.argv[1:]}")
