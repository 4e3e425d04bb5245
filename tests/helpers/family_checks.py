"""Shared checks for objectives beyond BERT (ALBERT, DistilBERT, ModernBERT,
RoBERTa), and for BERT, ModernBERT and RoBERTa on packed rows
("bert_packed", "modernbert_packed", "roberta_packed").

`mesh_losses` runs 3 train steps of an objective on 1 device and on 8
simulated CPU devices (DP=8, FSDP=8, DP=4 x TP=2) in a subprocess whose
XLA_FLAGS are set before jax is imported, and returns the per-step losses;
`assert_meshes_agree` checks them against the single device's.
`assert_resume_is_exact` runs `python -m bert_jax.main` for 8 steps (in
this process: no run is killed), copies its workdir keeping only the step-4
checkpoint, reruns the same command there (restoring state and
data-iterator position) and checks that steps 5-8 give the first run's
losses exactly.
Run as a script, this file is the subprocess of `mesh_losses`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MESHES = {"single": (1, 1, 1), "dp8": (8, 1, 1), "fsdp8": (1, 8, 1),
          "dp4_tp2": (4, 1, 2)}
STEPS = 3
# A ModernBERT small enough for the tests: 3 blocks (global, local, local),
# an 8-token window (so 32-token rows run the blocked sliding window).
MODERNBERT_TINY = dict(type_vocab_size=0, num_hidden_layers=3,
                       intermediate_size=96, local_attention=8,
                       global_attn_every_n_layers=3, layer_norm_eps=1e-5,
                       classifier_dropout_prob=0.0)
PACKED_SEQUENCES = 4


def family_batch(family: str, step: int) -> dict:
  """The synthetic batch of `step` (a packed one for "*_packed")."""
  from tests import helpers
  if family.endswith("_packed"):
    from tests.helpers import packed_rows
    return packed_rows.synthetic_batch(step, helpers.BATCH, helpers.SEQ,
                                       helpers.PREDS, PACKED_SEQUENCES,
                                       helpers.VOCAB)
  return helpers.synthetic_batch(step)


def family_config(family: str, data=1, fsdp=1, tensor=1):
  """tests.helpers' sharded config (dropout off) for `family`."""
  from tests import helpers
  c = helpers.sharded_config(data, fsdp, tensor)
  if family == "albert":
    c.objective.name = "albert"
    c.model.update(embedding_size=32, num_hidden_layers=3,
                   hidden_act="gelu_new", classifier_dropout_prob=0.0)
    c.data.update(objective="sop", max_ngram=3)
  elif family == "distil":
    c.objective.name = "distil"
    c.objective.update(student_layers=1, teacher="random")
    c.data.update(objective="packed", nsp=False)
  elif family == "bert_packed":
    c.data.update(packing=True, packing_max_sequences=PACKED_SEQUENCES)
  elif family in ("modernbert", "modernbert_packed"):
    c.objective.name = "modernbert"
    c.model.update(MODERNBERT_TINY)
    c.data.update(objective="packed", nsp=False)
    if family == "modernbert_packed":
      c.data.update(packing=True, packing_max_sequences=PACKED_SEQUENCES)
  elif family in ("roberta", "xlm-roberta", "roberta_packed"):
    c.objective.name = "xlm-roberta" if family == "xlm-roberta" else "roberta"
    # One token type; positions from the padding id (the synthetic batches
    # pad with 0).
    c.model.update(type_vocab_size=1, positions_from_pad=True,
                   pad_token_id=0, layer_norm_eps=1e-5)
    c.data.update(objective="packed", nsp=False)
    if family == "roberta_packed":
      c.data.update(packing=True, packing_max_sequences=PACKED_SEQUENCES)
  else:
    raise ValueError(family)
  return c


def load_config(name: str):
  """configs/<name>.py's get_config() (``tests.helpers.load_config``)."""
  from tests import helpers
  return helpers.load_config(name)


def _child(family: str, out_path: str) -> None:
  import jax
  import numpy as np

  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  assert jax.device_count() == 8, jax.devices()
  out = {}
  for name, shape in MESHES.items():
    config = family_config(family, *shape)
    mesh = sharding.make_mesh(config.mesh,
                              jax.devices()[:int(np.prod(shape))])
    programs = steps_lib.Programs(config, mesh)
    with programs.context():
      state = programs.warm_start(programs.init())
      losses = []
      for step in range(STEPS):
        batch = sharding.global_batch(family_batch(family, step),
                                      programs.batch_sharding)
        state, metrics = programs.train_step(state, batch)
        losses.append(float(metrics["loss"]))
    out[name] = losses
  with open(out_path, "w") as f:
    json.dump(out, f)


def mesh_losses(family: str, tmp_path) -> dict:
  out = os.path.join(str(tmp_path), f"{family}_mesh.json")
  from tests import helpers
  env = helpers.child_env(devices=8)
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), family,
                         out], env=env, cwd=REPO, capture_output=True,
                        text=True, timeout=900)
  if proc.returncode:
    raise AssertionError(proc.stdout[-2000:] + proc.stderr[-5000:])
  with open(out) as f:
    return json.load(f)


def assert_meshes_agree(family: str, tmp_path) -> None:
  """Every mesh of `mesh_losses` gives the single device's per-step losses
  (rtol 1e-5), and those losses move: a loss that stood still would agree
  whatever the sharding did."""
  import numpy as np
  losses = mesh_losses(family, tmp_path)
  for name in MESHES:
    np.testing.assert_allclose(losses[name], losses["single"], rtol=1e-5,
                               err_msg=name)
  assert losses["single"][0] != losses["single"][2]


def _train_losses(workdir) -> dict:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


def assert_resume_is_exact(tmp_path, config_file: str, *flags) -> str:
  """The run of configs/`config_file` (shrunk, with `flags`) resumed from
  its step-4 checkpoint logs steps 5-8 with the straight run's losses,
  bit for bit. Returns the straight run's workdir. Both runs are
  `python -m bert_jax.main` in this process (neither is killed)."""
  from tests.helpers import TINY_OVERRIDES
  from tests.helpers import in_process
  args = lambda w: ["--config", os.path.join(REPO, "configs", config_file),
                    "--workdir", w, *TINY_OVERRIDES,
                    "--config.train.num_steps=8",
                    "--config.train.log_every=1",
                    "--config.train.eval_every=1000",
                    "--config.checkpoint.save_every_steps=4",
                    "--config.checkpoint.max_to_keep=5",
                    "--config.checkpoint.async_save=False", *flags]
  a, b = os.path.join(str(tmp_path), "a"), os.path.join(str(tmp_path), "b")
  for workdir in (a, b):
    if workdir == b:  # Step 4 only: as if the first run had died after it.
      shutil.copytree(a, b)
      shutil.rmtree(os.path.join(b, "checkpoints", "8"))
      os.remove(os.path.join(b, "metrics.jsonl"))
    proc = in_process.run_module("main", *args(workdir))
    assert proc.returncode == 0, proc.stderr[-5000:]
  assert "Resumed from checkpoint step 4" in proc.stderr, proc.stderr[-3000:]
  straight, resumed = _train_losses(a), _train_losses(b)
  assert sorted(resumed) == [5, 6, 7, 8]
  for step, loss in resumed.items():
    assert loss == straight[step], (step, loss, straight[step])
  return a


def export_workdir(workdir: str, out: str) -> None:
  """`python -m bert_jax.to_hf` on a workdir (the run's objective picks the
  family)."""
  from tests.helpers import run_module
  proc = run_module("to_hf", "--workdir", workdir, "--output", out)
  assert proc.returncode == 0, proc.stderr[-3000:]


if __name__ == "__main__":
  _child(sys.argv[1], sys.argv[2])
