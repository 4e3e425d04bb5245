"""Phases of one run (BERT's 128 -> 512 recipe): the split, the schedule,
the checks, and exact resume after kill -9 in each phase and at the switch.

The end-to-end runs use a 30-step tiny run: 20 steps at seq 32 (batch 16)
then 10 at seq 64 (batch 8). A driver kills its own process with SIGKILL
right after the checkpoint of a chosen step is committed; rerunning the same
command must give every per-step loss of the uninterrupted run.
"""

import math
import os
import signal

import pytest

from tests import helpers
from tests.helpers import TINY_OVERRIDES

PHASES = ("({'num_steps': 20, 'seq_length': 32, 'max_predictions_per_seq': 5,"
          " 'batch_size': 16}, {'num_steps': 10, 'seq_length': 64, "
          "'max_predictions_per_seq': 10, 'batch_size': 8})")
FLAGS = (*TINY_OVERRIDES,
         "--config.train.num_steps=30",
         f"--config.train.phases={PHASES}",
         "--config.train.log_every=1",
         "--config.train.eval_every=100000",
         "--config.checkpoint.save_every_steps=2",
         "--config.checkpoint.max_to_keep=2")


# ------------------------------------------------------------------------------
# The phases a config describes, the schedule and the checks (in process).
# ------------------------------------------------------------------------------
def _config(**train):
  return helpers.tiny_config(train=dict(num_steps=30, **train))


def test_bert_two_phase_recipe_is_the_published_split():
  from bert_jax import config_lib
  from bert_jax.training import phases
  config = config_lib.get_config("base")
  config.train.update(num_steps=1000, recipe="bert_two_phase",
                      batch_size=256, warmup_steps=100)
  p1, p2 = phases.resolve(config)
  assert (p1.start, p1.num_steps, p1.seq_length, p1.max_predictions_per_seq,
          p1.batch_size, p1.warmup_steps) == (0, 900, 128, 20, 256, 100)
  assert (p2.start, p2.num_steps, p2.seq_length, p2.max_predictions_per_seq,
          p2.batch_size, p2.warmup_steps) == (900, 100, 512, 80, 256, 13)
  assert [phases.at_step([p1, p2], s).index for s in (0, 899, 900, 999)] == [
      0, 0, 1, 1]


def test_per_phase_schedule_warms_up_again_and_continuous_does_not():
  from bert_jax.training import optim
  from bert_jax.training import phases
  config = _config(phases=({"num_steps": 20, "seq_length": 32,
                            "max_predictions_per_seq": 5, "batch_size": 16},
                           {"num_steps": 10, "seq_length": 64,
                            "max_predictions_per_seq": 10, "batch_size": 8,
                            "learning_rate": 1e-3, "warmup_steps": 2}),
                   learning_rate=2e-3, warmup_steps=5)
  plan = phases.resolve(config)
  per_phase = optim.learning_rate_schedule(config.train, plan)
  assert float(per_phase(5)) == pytest.approx(2e-3)  # Phase 1 peak.
  assert float(per_phase(19)) == pytest.approx(2e-3 / 15)  # Decays to 0 at 20.
  assert float(per_phase(20)) == 0.0  # Phase 2 warms up again...
  assert float(per_phase(21)) == pytest.approx(0.5e-3)
  assert float(per_phase(22)) == pytest.approx(1e-3)  # ...to its own peak.
  config.train.phase_schedule = "continuous"
  continuous = optim.learning_rate_schedule(config.train, plan)
  single = optim.learning_rate_schedule(config.train)
  for step in (0, 5, 19, 20, 29):
    assert float(continuous(step)) == float(single(step))


def _flat(tree):
  import jax
  import numpy as np
  return np.concatenate([np.ravel(np.asarray(x, np.float64))
                         for x in jax.tree.leaves(tree)])


@pytest.mark.slow
def test_logged_learning_rate_is_the_rate_the_update_applied():
  """The real train step through a two-phase per_phase schedule: the rate
  each AdamW update applied, recovered from how it moved the params
  (update = -lr * (Adam direction + weight_decay * param), the direction from
  optax.scale_by_adam on the same clipped gradients), is the step's
  metrics["learning_rate"]: in warmup, decay, at the switch (warming up
  again) and after a non-finite step, whose dropped update leaves the
  optimizer's count (and so its schedule) one step behind the train step."""
  import jax
  import numpy as np
  import optax

  from bert_jax.training import optim
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  config = helpers.sharded_config(num_steps=8, train=dict(
      weight_decay=0.01, phases=(
          {"num_steps": 4, "seq_length": 32, "max_predictions_per_seq": 5,
           "batch_size": 16, "learning_rate": 2e-3, "warmup_steps": 2},
          {"num_steps": 4, "seq_length": 64, "max_predictions_per_seq": 10,
           "batch_size": 8, "learning_rate": 1e-3, "warmup_steps": 2})))
  t = config.train
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  nonfinite_step = 5
  batches = [helpers.synthetic_batch(i, batch=16, seq=32, preds=5)
             for i in range(4)] + [
                 helpers.synthetic_batch(i, batch=8, seq=64, preds=10)
                 for i in range(4, 8)]
  batches[nonfinite_step]["masked_lm_weights"][0, 0] = np.nan
  grad_fn = jax.jit(jax.grad(lambda p, b: steps_lib.batch_loss(
      p, b, graphdef=programs.graphdef, config=config,
      objective=programs.objective)))
  adam = optax.chain(optax.clip_by_global_norm(t.max_grad_norm),
                     optax.scale_by_adam(t.adam_b1, t.adam_b2, t.adam_eps))
  with programs.context():
    state = programs.init()
    adam_state = adam.init(jax.device_get(state["params"]))
    applied, logged = {}, {}
    for step, local in enumerate(batches):
      batch = sharding.global_batch(local, programs.batch_sharding)
      old = jax.device_get(state["params"])
      grads = jax.device_get(grad_fn(state["params"], batch))
      state, metrics = programs.train_step(state, batch)
      new, metrics = jax.device_get((state["params"], metrics))
      logged[step] = float(metrics["learning_rate"])
      if step == nonfinite_step:
        assert not metrics["finite"]
        np.testing.assert_array_equal(_flat(new), _flat(old))
        continue
      direction, adam_state = adam.update(grads, adam_state, old)
      direction = jax.tree.map(
          lambda d, p, decays: d + t.weight_decay * decays * p,
          direction, old, optim.decay_mask(old))
      d, u = _flat(direction), _flat(new) - _flat(old)
      applied[step] = float(-(u @ d) / (d @ d))
      # The update is that multiple of the direction, element by element
      # (float32 rounding and gradients summed in another order aside).
      np.testing.assert_allclose(u, -applied[step] * d, rtol=0,
                                 atol=1e-4 * applied[step] + 1e-8)
  for step, lr in applied.items():
    assert logged[step] == pytest.approx(lr, rel=1e-4, abs=1e-10), (
        step, logged[step], lr)
  # The schedule the run expects: warmup to 2e-3 and decay; warmup again
  # at the switch (step 4); after the dropped step 5 the optimizer applies
  # the rate of its own count, one behind.
  expected = {0: 0.0, 1: 1e-3, 2: 2e-3, 3: 1e-3, 4: 0.0, 6: 0.5e-3,
              7: 1e-3}
  assert applied == pytest.approx(expected, rel=1e-4, abs=1e-10)


@pytest.mark.parametrize("train, message", [
    (dict(phases=({"num_steps": 20, "seq_length": 32,
                   "max_predictions_per_seq": 5, "batch_size": 16},)),
     "train.phases add up to 20 steps but train.num_steps=30"),
    (dict(phases=({"num_steps": 30, "seq_len": 32,
                   "max_predictions_per_seq": 5, "batch_size": 16},)),
     r"train.phases\[0\] has unknown keys \['seq_len'\]; no \['seq_length'\]"),
    (dict(phases=({"num_steps": 20, "seq_length": 32,
                   "max_predictions_per_seq": 5, "batch_size": 16},
                  {"num_steps": 10, "seq_length": 128,
                   "max_predictions_per_seq": 20, "batch_size": 16})),
     r"Phase 1 of the run \(seq_length 128.*data.seq_length=128 exceeds "
     "model.max_position_embeddings=64"),
    (dict(phases=({"num_steps": 20, "seq_length": 32,
                   "max_predictions_per_seq": 5, "batch_size": 16},
                  {"num_steps": 10, "seq_length": 64,
                   "max_predictions_per_seq": 10, "batch_size": 6})),
     "Phase 1 of the run.*train.batch_size=6 is not divisible"),
    # Numbers where the dicts go: one line naming the field, not Python's
    # "TypeError: 'int' object is not iterable".
    (dict(phases=(20, 10)),
     r"^train.phases=\(20, 10\) must be a tuple of dicts, one per phase, "
     r"e.g. --config.train.phases=\"\(\{'num_steps': 900, "),
    (dict(phases=({"num_steps": 30, "seq_length": 32,
                   "max_predictions_per_seq": 5, "batch_size": 16}, 10)),
     r"^train.phases\[1\]=10 is not a dict: train.phases must be a tuple "
     "of dicts"),
    (dict(phases=({"num_steps": "30", "seq_length": 32,
                   "max_predictions_per_seq": 5, "batch_size": 16},)),
     r"^train.phases\[0\].num_steps='30' must be a whole number\.$"),
    (dict(recipe="bert_three_phase"), "train.recipe='bert_three_phase'"),
    (dict(phase_schedule="cosine"), "train.phase_schedule='cosine'"),
    (dict(phase_data="restart"), "train.phase_data='restart'"),
])
def test_bad_phases_are_one_sentence_naming_the_field(train, message):
  from bert_jax.training import config_checks
  with pytest.raises(ValueError, match=message) as e:
    config_checks.validate(_config(**train), num_devices=4,
                           check_sources=False)
  assert len(str(e.value).splitlines()) == 1


def test_fine_tuning_refuses_phases(tmp_path):
  from bert_jax.training import trainer as trainer_lib
  config = _config(recipe="bert_two_phase")

  class Data:
    train_iter, eval_batches = iter(()), []
  with pytest.raises(ValueError, match="pretraining runs only"):
    trainer_lib.Trainer(config, str(tmp_path), data=Data())


# ------------------------------------------------------------------------------
# End to end: one run through both phases, killed and resumed.
# ------------------------------------------------------------------------------
def _run(workdir, *extra, kill_after=None):
  """A run killed after a save is a child; the others run in this process."""
  return helpers.run_main_logged(workdir, "tiny.py", *FLAGS, *extra,
                                 kill_after=kill_after,
                                 here=kill_after is None)


def _losses(records) -> dict[int, float]:
  return {r["step"]: r["loss"] for r in records}  # A redone step: the last.


@pytest.fixture(scope="module", params=["reshuffle", "continue"])
def runs(request, tmp_path_factory):
  """Uninterrupted run and killed-and-resumed runs of one phase_data policy."""
  policy = request.param
  flag = f"--config.train.phase_data={policy}"
  root = tmp_path_factory.mktemp(f"phases_{policy}")
  reference = str(root / "reference")
  os.makedirs(reference)
  # The reference only logs: no checkpoint before its end (saving every 2
  # steps is most of a run's time).
  assert _run(reference, flag,
              "--config.checkpoint.save_every_steps=1000") == 0, (
                  helpers.run_log(reference)[-3000:])
  # kill -9 after the checkpoint of step 20 (the last step of phase 1: the
  # rerun switches at once) and of 22 (just after the switch); the
  # "continue" policy's skipped pipeline only needs the last. (A resume
  # inside one phase is any run's: tests/training/test_resume.py.)
  kills = (20, 22) if policy == "reshuffle" else (22,)
  killed = str(root / "killed")
  os.makedirs(killed)
  codes = [_run(killed, flag, kill_after=k) for k in kills]
  codes.append(_run(killed, flag))
  return dict(policy=policy, reference=reference, killed=killed, kills=kills,
              codes=codes)


@pytest.mark.slow
def test_two_phase_run_switches_once_and_logs_it(runs):
  log = helpers.run_log(runs["reference"])
  assert log.count("Phase 2/2 from step 20: seq_length 64, "
                   "max_predictions_per_seq 10, batch_size 8") == 1
  # Both phases' steps compiled before step 1, none later.
  assert "Compiled the train step of phase 2/2 (seq_length 64" in log
  assert "Compiled the train step for batch shape" not in log
  records = helpers.train_records(runs["reference"])
  assert [r["step"] for r in records] == list(range(1, 31))
  assert all(math.isfinite(r["loss"]) for r in records)
  if runs["policy"] == "continue":
    assert "data: after the 320 examples consumed (40 batches skipped)" in log
  else:
    assert "data: the pipeline again with its own seed" in log


@pytest.mark.slow
def test_kill9_in_each_phase_and_at_the_switch_resumes_exactly(runs):
  ref = _losses(helpers.train_records(runs["reference"]))
  assert sorted(ref) == list(range(1, 31))
  *killed_codes, final = runs["codes"]
  assert killed_codes == [-signal.SIGKILL] * len(runs["kills"])
  assert final == 0, helpers.run_log(runs["killed"])[-3000:]
  log = helpers.run_log(runs["killed"])
  resumed = [int(line.rsplit("step ", 1)[1].split()[0])
             for line in log.splitlines()
             if "Resumed from checkpoint step" in line]
  assert resumed == list(runs["kills"])
  records = helpers.train_records(runs["killed"])
  assert _losses(records) == ref
  for rec in records:  # Every step, also the ones redone, equals the reference.
    assert rec["loss"] == ref[rec["step"]], rec
