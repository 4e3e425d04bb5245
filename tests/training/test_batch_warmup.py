"""Batch-size warm-up and the learning-rate schedule counted in tokens.

In process: the sizes and steps a warm-up resolves to (ModernBERT's 768 ->
4,608 over 50B tokens among them), the schedule as a function of tokens,
the refusals. End to end (`python -m bert_jax.main`, an 18-step tiny run of
three phases: a warm-up 4 -> 8 -> 12 -> 16 at 30% masking, a stable phase,
a decay at 15%): every step's batch and learning rate are the plan's, the
same run on 8 devices gives the same losses, and kill -9 inside a size,
at a size change and at a phase switch resumes with the uninterrupted run's
losses.
"""

import dataclasses
import signal

import numpy as np
import pytest

from tests import helpers
from tests.helpers import TINY_OVERRIDES


def _config(num_steps=30, **train):
  return helpers.tiny_config(train=dict(num_steps=num_steps, **train))


def _warmup(start, increment, tokens):
  return dict(start=start, increment=increment, tokens=tokens)


# ------------------------------------------------------------------------------
# The plan (in process).
# ------------------------------------------------------------------------------
def test_modernbert_warmup_is_expressible():
  """768 -> 4,608 sequences of 1,024 tokens over 50B tokens, equal steps
  per size (ModernBERT's BatchSizeWarmupScheduler holds each size for tokens
  in proportion to it)."""
  from bert_jax import config_lib
  from bert_jax.training import phases
  config = config_lib.get_config("base")
  config.data.update(seq_length=1024, max_predictions_per_seq=308)
  config.train.update(num_steps=400_000, batch_size=4608,
                      batch_warmup=_warmup(768, 768, 50e9))
  phase, = phases.resolve(config)
  sizes = [768, 1536, 2304, 3072, 3840]
  each = round(50e9 / (1024 * sum(sizes)))
  assert phase.ramp == tuple((k * each, b) for k, b in enumerate(sizes)) + (
      (5 * each, 4608),)
  warmup_tokens = phases.tokens_before([phase], 5 * each)
  assert abs(warmup_tokens - 50e9) < 1024 * sum(sizes) / 2
  assert [phase.batch_at(s) for s in (0, each - 1, each, 5 * each - 1,
                                      5 * each, 399_999)] == [
                                          768, 768, 1536, 3840, 4608, 4608]
  assert phase.unit == 768


def _wsd(peak, warmup, decay, total):
  """The configured curve, written out: 0 -> peak over `warmup` tokens,
  peak, then linearly to 0 over the last `decay`."""
  def lr(tokens):
    if tokens < warmup:
      return peak * tokens / warmup
    return peak * min(1.0, (total - tokens) / decay)
  return lr


def test_learning_rate_is_the_configured_curve_of_tokens():
  """Counted in tokens, the rate of every step is the curve at the tokens
  of the steps before it, through the warm-up's sizes and a phase of
  another sequence length; counted in steps, a grown batch would stretch
  it."""
  from bert_jax.training import optim
  from bert_jax.training import phases
  config = _config(
      num_steps=30, schedule="wsd", schedule_unit="tokens",
      warmup_tokens=1000, decay_tokens=3000, learning_rate=2e-3,
      phase_schedule="continuous", phases=(
          {"num_steps": 20, "seq_length": 32, "max_predictions_per_seq": 5,
           "batch_size": 16, "batch_warmup": _warmup(4, 4, 1536)},
          {"num_steps": 10, "seq_length": 64, "max_predictions_per_seq": 10,
           "batch_size": 8}))
  plan = phases.resolve(config)
  assert [plan[0].batch_at(s) for s in range(8)] == [4, 4, 8, 8, 12, 12,
                                                     16, 16]
  total = phases.tokens_before(plan, 30)
  assert total == 32 * (2 * (4 + 8 + 12) + 14 * 16) + 64 * 8 * 10
  curve = _wsd(2e-3, 1000, 3000, total)
  schedule = optim.learning_rate_schedule(config.train, plan)
  for step in range(31):
    assert float(schedule(step)) == pytest.approx(
        curve(phases.tokens_before(plan, step)), rel=1e-6, abs=1e-9), step
  per_phase = dict(config.train.to_dict(), phase_schedule="per_phase")
  plan[1] = dataclasses.replace(plan[1], warmup_tokens=0,
                                decay_tokens=plan[1].tokens)
  schedule = optim.learning_rate_schedule(
      helpers.tiny_config(train=per_phase).train, plan)
  start = phases.tokens_before(plan, 20)  # Phase 2 decays over its tokens.
  for step in range(20, 31):
    assert float(schedule(step)) == pytest.approx(
        2e-3 * (1 - (phases.tokens_before(plan, step) - start) /
                plan[1].tokens), rel=1e-6, abs=1e-9), step


def test_modernbert_recipe_config_is_the_documented_schedule():
  """configs/modernbert_recipe.py: 8, 16, 24 for 20 steps each, then 32;
  30%, 30%, 15% masking; warmup over 30,720 tokens, 1e-3, then a 1-sqrt
  decay to 0 over the last phase's tokens."""
  from bert_jax.training import config_checks
  from bert_jax.training import optim
  from bert_jax.training import phases
  config = helpers.load_config("modernbert_recipe")
  plan = config_checks.validate(config, num_devices=1, check_sources=False)
  assert [p.num_steps for p in plan] == [150, 150, 100]
  assert [dict(p.data)["mask_rate"] for p in plan] == [0.3, 0.3, 0.15]
  assert [plan[0].batch_at(s) for s in (0, 19, 20, 39, 40, 59, 60, 149)] == [
      8, 8, 16, 16, 24, 24, 32, 32]
  assert [p.batch_sizes for p in plan[1:]] == [(32,), (32,)]
  schedule = optim.learning_rate_schedule(config.train, plan)
  total, decay = phases.tokens_before(plan, 400), plan[2].tokens
  for step in (0, 10, 30, 299, 300, 350, 399):
    tokens = phases.tokens_before(plan, step)
    frac = max(0.0, (tokens - (total - decay)) / decay)
    expected = 1e-3 * min(1.0, tokens / 30_720) * (1 - np.sqrt(frac))
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-5,
                                                  abs=1e-9), step


@pytest.mark.parametrize("train, message", [
    (dict(batch_warmup=_warmup(16, 4, 1000)),
     r"^train.batch_warmup.start=16 must be in \(0, the phase's "
     r"batch_size=16\)\.$"),
    (dict(batch_warmup=dict(start=4, step=4, tokens=1000)),
     r"^train.batch_warmup has unknown keys \['step'\] \(it sets start, "
     r"increment, tokens\)\.$"),
    (dict(batch_warmup=_warmup(4, 4, 10)),
     r"^train.batch_warmup.tokens=10 is less than one step at each of the "
     r"sizes \[4, 8, 12\]"),
    (dict(batch_warmup=_warmup(4, 4, 1e5)),
     r"^train.batch_warmup: the warm-up takes 390 steps \(130 at each of 3 "
     r"sizes\), not fewer than the phase's num_steps=30\.$"),
    (dict(batch_warmup=_warmup(4, 2, 1000)),
     r"^Phase 0 of the run \(.*, its warm-up batch of 6\): "
     r"train.batch_size=6 is not divisible by the data-parallel size"),
    (dict(phases=({"num_steps": 30, "seq_length": 32,
                   "max_predictions_per_seq": 5, "batch_size": 16,
                   "batch_warmup": {"start": 4, "increment": 4,
                                    "tokens": 0.5}},)),
     r"^train.phases\[0\].batch_warmup.tokens=0.5 must be a whole number\.$"),
    (dict(schedule_unit="sequences"),
     r"^train.schedule_unit='sequences' is not one of \('steps', "
     r"'tokens'\)\.$"),
    (dict(schedule="wsd", schedule_unit="tokens", decay_tokens=1e6),
     r"^train.decay_tokens=1000000 must be in \[0, tokens - warmup_tokens = "
     r"15360\]\.$"),
])
def test_bad_warmup_or_unit_is_one_line_naming_the_field(train, message):
  from bert_jax.training import config_checks
  with pytest.raises(ValueError, match=message) as e:
    config_checks.validate(_config(**train), num_devices=4,
                           check_sources=False)
  assert len(str(e.value).splitlines()) == 1


# ------------------------------------------------------------------------------
# End to end: the recipe's shape on a tiny run, killed and resumed, 1 vs 8.
# ------------------------------------------------------------------------------
WARMUP = _warmup(4, 4, 1536)  # 4, 8, 12: two steps each at seq 32.
PHASES = (
    {"num_steps": 10, "seq_length": 32, "max_predictions_per_seq": 10,
     "batch_size": 16, "batch_warmup": WARMUP, "data": {"mask_rate": 0.3}},
    {"num_steps": 4, "seq_length": 32, "max_predictions_per_seq": 10,
     "batch_size": 16, "data": {"mask_rate": 0.3}},
    {"num_steps": 4, "seq_length": 32, "max_predictions_per_seq": 5,
     "batch_size": 16, "data": {"mask_rate": 0.15}})
DECAY_TOKENS = 4 * 16 * 32  # The last phase's.
FLAGS = (*TINY_OVERRIDES,
         "--config.model.hidden_dropout_prob=0.0",
         "--config.model.attention_probs_dropout_prob=0.0",
         "--config.train.num_steps=18",
         f"--config.train.phases={PHASES!r}",
         "--config.train.phase_data=continue",
         "--config.train.phase_schedule=continuous",
         "--config.train.schedule=wsd",
         "--config.train.schedule_unit=tokens",
         "--config.train.warmup_tokens=1000",
         f"--config.train.decay_tokens={DECAY_TOKENS}",
         "--config.train.log_every=1",
         "--config.train.eval_every=100000",
         "--config.checkpoint.save_every_steps=1",
         "--config.checkpoint.max_to_keep=2")
# Steps done when killed: inside size 8 (3), at the change to 12 (4) and at
# the switch to phase 2 (10).
KILLS = (3, 4, 10)


# The runs that only log (the reference, 8 devices) save no checkpoint
# before the end: a save a step is most of such a run's time.
LOG_ONLY = ("--config.checkpoint.save_every_steps=1000",)


def _run(workdir, devices=1, *extra, kill_after=None):
  """A run on 8 devices or killed after a save is a child; the others run
  in this process."""
  return helpers.run_main_logged(
      workdir, "tiny.py", *FLAGS, *extra,
      env=None if devices == 1 else helpers.child_env(devices=devices),
      kill_after=kill_after, timeout=900,
      here=devices == 1 and kill_after is None)


def _records(workdir):
  return {r["step"]: r for r in helpers.train_records(workdir)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("warmup") / "reference")
  assert _run(workdir, 1, *LOG_ONLY) == 0, helpers.run_log(workdir)[-3000:]
  return workdir


@pytest.mark.slow
def test_each_step_has_the_planned_batch_and_learning_rate(reference):
  from bert_jax.training import phases
  records = _records(reference)
  assert sorted(records) == list(range(1, 19))
  config = helpers.tiny_config(train=dict(num_steps=18, phases=PHASES))
  plan = phases.resolve(config)
  sizes = [4, 4, 8, 8, 12, 12] + [16] * 12
  assert [records[s]["batch_size"] for s in range(1, 19)] == sizes
  curve = _wsd(2e-3, 1000, DECAY_TOKENS, phases.tokens_before(plan, 18))
  for step, r in records.items():
    # The rate a step applied is the curve at the tokens before it.
    assert r["tokens_seen"] == phases.tokens_before(plan, step)
    before = r["tokens_seen"] - sizes[step - 1] * 32
    assert r["learning_rate"] == pytest.approx(curve(before), rel=1e-6,
                                               abs=1e-9), step
  log = helpers.run_log(reference)
  for size, step in ((8, 2), (12, 4), (16, 6)):
    assert f"Global batch {size} from step {step} " in log
  assert "Compiled the train step for batch shape" not in log  # All ahead.
  assert "Phase 3/3 from step 14: seq_length 32, max_predictions_per_seq 5" \
      ", batch_size 16, data.mask_rate 0.15" in log


@pytest.mark.slow
def test_eight_devices_give_the_same_losses(reference, tmp_path):
  workdir = str(tmp_path / "eight")
  assert _run(workdir, 8, "--config.mesh.data=4", "--config.mesh.tensor=2",
              *LOG_ONLY) == 0, helpers.run_log(workdir)[-3000:]
  assert "over 8 devices" in helpers.run_log(workdir)
  ours = {s: r["loss"] for s, r in _records(workdir).items()}
  ref = {s: r["loss"] for s, r in _records(reference).items()}
  assert sorted(ours) == sorted(ref)
  np.testing.assert_allclose([ours[s] for s in sorted(ref)],
                             [ref[s] for s in sorted(ref)], rtol=1e-5)


@pytest.mark.slow
def test_kill9_inside_and_across_size_changes_resumes_exactly(reference,
                                                              tmp_path):
  workdir = str(tmp_path / "killed")
  codes = [_run(workdir, kill_after=k) for k in KILLS] + [_run(workdir)]
  assert codes == [-signal.SIGKILL] * len(KILLS) + [0], (
      helpers.run_log(workdir)[-3000:])
  log = helpers.run_log(workdir)
  resumed = [int(line.rsplit("step ", 1)[1].split()[0])
             for line in log.splitlines()
             if "Resumed from checkpoint step" in line]
  assert resumed == list(KILLS)
  ref = {s: r["loss"] for s, r in _records(reference).items()}
  for rec in helpers.train_records(workdir):  # Redone steps too.
    assert rec["loss"] == ref[rec["step"]], rec
  assert {r["step"] for r in helpers.train_records(workdir)} == set(ref)
