"""The ModernBERT objective in the trainer: 1 vs 8 simulated devices, a
two-phase run with a context-extension phase (its own RoPE base) that
resumes exactly after kill -9, whose export gives our logits in PyTorch,
and the checks that refuse what ModernBERT does not train.

The run: configs/modernbert_base.py shrunk (3 blocks, 8-token window, the
TINY_OVERRIDES widths), 6 steps at 32 tokens then 4 at 64 with
global_rope_theta 10,000 -> 160,000, StableAdamW and warmup-stable-decay
(continuous over both phases). A driver SIGKILLs itself right after the
checkpoint of step 8 (in phase 2) is committed; the same command again must
give every per-step loss of the uninterrupted run.
"""

import json
import os
import signal

import numpy as np
import pytest
from flax import nnx

from tests import helpers
from tests.helpers import family_checks

PHASES = ("({'num_steps': 6, 'seq_length': 32, 'max_predictions_per_seq': 10,"
          " 'batch_size': 16}, {'num_steps': 4, 'seq_length': 64, "
          "'max_predictions_per_seq': 20, 'batch_size': 8, "
          "'model': {'global_rope_theta': 160000.0}})")
FLAGS = (*helpers.TINY_OVERRIDES,
         "--config.model.num_hidden_layers=3",
         "--config.model.intermediate_size=96",
         "--config.model.local_attention=8",
         "--config.data.max_predictions_per_seq=10",
         "--config.train.num_steps=10",
         "--config.train.warmup_steps=2",
         "--config.train.decay_steps=3",
         "--config.train.phase_schedule=continuous",
         f"--config.train.phases={PHASES}",
         "--config.train.log_every=1",
         "--config.train.eval_every=1000",
         "--config.checkpoint.save_every_steps=2",
         "--config.checkpoint.max_to_keep=2")
KILL_AFTER = 8


def _run(workdir, *extra, kill_after=None):
  """A run killed after a save is a child; the others run in this process.
  The suite's persistent XLA cache: the three runs' steps compile once."""
  return helpers.run_main_logged(workdir, "modernbert_base.py", *FLAGS,
                                 *extra, kill_after=kill_after, timeout=900,
                                 here=kill_after is None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("modernbert_runs")
  reference, killed = str(root / "reference"), str(root / "killed")
  assert _run(reference) == 0, helpers.run_log(reference)[-3000:]
  # The reference's tokenizer: no second training of the same one.
  with open(os.path.join(reference, "tokenizer", "record.json")) as f:
    tok = json.load(f)["path"]
  tok = tok if os.path.isabs(tok) else os.path.join(reference, tok)
  flag = f"--config.data.tokenizer_path={tok}"
  codes = [_run(killed, flag, kill_after=KILL_AFTER),
           _run(killed, flag)]
  return dict(reference=reference, killed=killed, codes=codes, root=root)


def _losses(workdir):
  return {r["step"]: r["loss"] for r in helpers.train_records(workdir)}


@pytest.mark.slow
def test_context_extension_phase_runs_with_its_own_rope_base(runs):
  log = helpers.run_log(runs["reference"])
  assert log.count("Phase 2/2 from step 6: seq_length 64, "
                   "max_predictions_per_seq 20, batch_size 8, "
                   "model.global_rope_theta 160000.0") == 1
  assert "Compiled the train step for batch shape" not in log
  records = helpers.train_records(runs["reference"])
  assert [r["step"] for r in records] == list(range(1, 11))
  lr = [r["learning_rate"] for r in records]
  # Warmup 2, stable, the last 3 steps decay (one schedule over both).
  assert lr[0] == 0.0 and lr[2] == lr[6] == pytest.approx(2e-3)
  assert lr[9] < lr[8] < lr[7]
  assert records[-1]["loss"] < records[0]["loss"]


@pytest.mark.slow
def test_kill9_in_the_extension_phase_resumes_exactly(runs):
  assert runs["codes"] == [-signal.SIGKILL, 0], helpers.run_log(
      runs["killed"])[-3000:]
  assert (f"Resumed from checkpoint step {KILL_AFTER}"
          in helpers.run_log(runs["killed"]))
  ref = _losses(runs["reference"])
  assert _losses(runs["killed"]) == ref
  for rec in helpers.train_records(runs["killed"]):
    assert rec["loss"] == ref[rec["step"]], rec


@pytest.mark.slow
def test_trained_run_exports_with_its_last_phase_and_our_logits(runs):
  """tools/convert_to_hf.py on the run: config.json carries the extension
  phase's RoPE base; ModernBertForMaskedLM in PyTorch gives our logits on
  the trained weights (rows longer than the window, padding)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  import jax
  from flax import nnx

  from bert_jax import pretrained
  from bert_jax.downstream import mask_filling
  from bert_jax.families import modernbert as modernbert_family
  from bert_jax.hf import mapping
  out = str(runs["root"] / "hf")
  family_checks.export_workdir(runs["reference"], out)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["architectures"] == ["ModernBertForMaskedLM"]
  assert cfg["rope_parameters"]["full_attention"]["rope_theta"] == 160_000.0
  source = pretrained.resolve(runs["reference"])
  config = pretrained.load_model_config(source)
  assert config.global_rope_theta == 160_000.0
  params, _ = pretrained.load_params(source, config)
  r = np.random.RandomState(0)
  mask = (np.arange(48)[None] < np.asarray([[48], [30]])).astype(np.int32)
  ids = (r.randint(5, 512, (2, 48)) * mask).astype(np.int32)
  graphdef, state = nnx.split(mapping.make_model(
      params, config, modernbert_family.MODERNBERT))
  ours = np.asarray(jax.jit(lambda s: nnx.merge(graphdef, s)(ids, mask))(
      state)["mlm_logits"])
  model = transformers.ModernBertForMaskedLM.from_pretrained(
      out, attn_implementation="eager", dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long(),
                   attention_mask=torch.tensor(mask).long()).logits.numpy()
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=1e-4)
  result = mask_filling.fill_mask(out, "the [MASK] of the function .",
                                  top_k=2)
  assert len(result) == 2 and result[0]["score"] >= result[1]["score"]


@pytest.mark.slow
def test_one_vs_eight_devices_same_losses(tmp_path):
  family_checks.assert_meshes_agree("modernbert", tmp_path)


@pytest.mark.parametrize("change, message", [
    (dict(data=dict(nsp=True, objective="nsp")),
     "ModernBERT trains no sentence-pair head.*set data.nsp=False"),
    (dict(model=dict(local_attention=7)),
     "model.local_attention=7 must be an even window"),
    (dict(model=dict(num_attention_heads=3)),
     "model.hidden_size=64 is not divisible by model.num_attention_heads=3"),
    (dict(train=dict(phases=({"num_steps": 10, "seq_length": 32,
                              "max_predictions_per_seq": 5, "batch_size": 16,
                              "model": {"hidden_size": 128}},))),
     r"train.phases\[0\].model sets \['hidden_size'\]"),
    (dict(train=dict(schedule="wsd", decay_steps=20)),
     r"train.decay_steps=20 must be in \[0, num_steps - warmup_steps"),
    (dict(train=dict(schedule="wsd", phases=(
        {"num_steps": 6, "seq_length": 32, "max_predictions_per_seq": 5,
         "batch_size": 16},
        {"num_steps": 4, "seq_length": 32, "max_predictions_per_seq": 5,
         "batch_size": 16, "decay_steps": 5}))),
     r"train.decay_steps=5 must be in \[0, num_steps - warmup_steps = 3\]"),
])
def test_startup_checks_name_the_field(change, message):
  from bert_jax.training import config_checks
  config = family_checks.family_config("modernbert")
  for group, fields in change.items():
    config[group].update(fields)
  with pytest.raises(ValueError, match=message):
    config_checks.validate(config, num_devices=1, check_sources=False)


@pytest.mark.slow
def test_a_phase_model_entry_gets_its_own_graph_over_the_same_state():
  """Programs.steps_for: the run's own steps for a phase without a "model"
  entry; for one with (other RoPE bases, a narrower window) a step of its
  own, cached, whose loss on the same state and batch is the phase model's,
  not the run's."""
  from bert_jax.training import phases
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  config = family_checks.family_config("modernbert")
  shape = dict(seq_length=32, max_predictions_per_seq=5, batch_size=16)
  config.train.phases = (dict(num_steps=6, **shape), dict(
      num_steps=4, model={"global_rope_theta": 2.0, "local_rope_theta": 2.0,
                          "local_attention": 2}, **shape))
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  first, second = (phases.phase_config(config, p)
                   for p in phases.resolve(config))
  assert programs.steps_for(first) == (programs.train_step,
                                       programs.eval_step)
  train2, eval2 = programs.steps_for(second)
  assert train2 is not programs.train_step
  assert programs.steps_for(second) == (train2, eval2)  # Compiled once.
  batch = sharding.global_batch(helpers.synthetic_batch(0),
                                programs.batch_sharding)
  import jax

  def state():  # Weights far from init's small ones: attention matters.
    s = programs.init()
    return dict(s, params=jax.tree.map(lambda x: 8.0 * x, s["params"]))

  with programs.context():
    params = state()["params"]
    losses = [float(step(state(), batch)[1]["loss"])
              for step in (programs.train_step, train2)]
  model2 = steps_lib.abstract_model(second)
  want = float(steps_lib.batch_loss(
      params, batch, graphdef=nnx.split(model2, nnx.Param)[0], config=second,
      objective=programs.objective))
  assert losses[1] == pytest.approx(want, rel=1e-6)
  assert abs(losses[0] - losses[1]) > 1e-4 * losses[0], losses
