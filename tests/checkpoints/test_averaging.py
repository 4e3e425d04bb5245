"""`python -m bert_jax.average`: the mean of chosen steps of one run, as a
workdir that exports (PyTorch's logits equal ours) and fine-tunes; steps
chosen by the held-out eval each step recorded; refusals in one line with
nothing written.

One tiny BERT run (6 steps, a checkpoint and a held-out eval every 2 steps)
is made once for the module.
"""

import json
import os
import shutil

import numpy as np
import pytest

from tests import helpers
from tests.helpers import in_process


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("avg") / "run")
  result = in_process.run_main(
      workdir, "--config.train.num_steps=6", "--config.train.eval_every=2",
      "--config.checkpoint.save_every_steps=2",
      "--config.checkpoint.max_to_keep=10",
      "--config.checkpoint.async_save=False")
  assert result.returncode == 0, result.stderr[-3000:]
  return workdir


def _average(*args):
  from bert_jax import average
  return average.main(list(args))


def _params(path, step=None):
  from bert_jax.checkpoints import reading
  return reading.load_params(path, step)


def _flat(tree):
  import jax
  return {jax.tree_util.keystr(p): np.asarray(x)
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.slow
def test_two_steps_average_bit_for_bit(run, tmp_path, capsys):
  out = str(tmp_path / "avg")
  assert _average("--workdir", run, "--steps", "2,4", "--output", out) == 0
  assert "the mean of steps [2, 4]" in capsys.readouterr().out
  mean, config, step = _params(out)
  assert step == 4  # The newest chosen step.
  a, b = _flat(_params(run, 2)[0]), _flat(_params(run, 4)[0])
  got = _flat(mean)
  assert sorted(got) == sorted(a)
  for k in a:
    expected = (a[k] + b[k]) / np.float32(2)  # float32 all the way.
    assert got[k].dtype == np.float32
    assert np.array_equal(got[k].view(np.int32), expected.view(np.int32)), k
  assert config.to_dict() == _params(run, 4)[1].to_dict()  # The run's.
  with open(os.path.join(out, "averaged.json")) as f:
    provenance = json.load(f)
  assert provenance == dict(run=os.path.abspath(run), steps=[2, 4],
                            of="params", method="mean", by=None, scores={})
  assert os.path.isfile(os.path.join(out, "tokenizer", "record.json"))


@pytest.mark.slow
def test_best_by_the_eval_each_step_recorded(run, tmp_path):
  """--best 2 --by eval_loss --include_last: the two steps with the lowest
  held-out loss in metrics.jsonl, and the last one; their mean."""
  evals = {}
  with open(os.path.join(run, "metrics.jsonl")) as f:
    for line in f:
      r = json.loads(line)
      if r["split"] == "eval":
        evals[r["step"]] = r["loss"]
  assert sorted(evals) == [2, 4, 6]
  best = sorted(sorted(evals, key=evals.get)[:2])
  out = str(tmp_path / "best")
  assert _average("--workdir", run, "--best", "2", "--by", "eval_loss",
                  "--after_step", "0", "--output", out) == 0
  with open(os.path.join(out, "averaged.json")) as f:
    provenance = json.load(f)
  assert provenance["steps"] == best and provenance["by"] == "eval_loss"
  assert provenance["scores"] == {str(s): pytest.approx(evals[s])
                                  for s in best}
  out = str(tmp_path / "best_and_last")
  assert _average("--workdir", run, "--best", "1", "--by", "eval_loss",
                  "--include_last", "--output", out) == 0
  chosen = sorted({min(evals, key=evals.get), 6})
  got = _flat(_params(out)[0])
  steps = [_flat(_params(run, s)[0]) for s in chosen]
  for k in got:
    np.testing.assert_allclose(got[k], np.mean([s[k] for s in steps], 0),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_each_saved_step_records_its_own_eval(run):
  """The metric --best ranks by: each step's meta holds the held-out eval
  run at that step (metrics.jsonl's eval row of the step)."""
  from bert_jax.checkpoints import reading
  with open(os.path.join(run, "metrics.jsonl")) as f:
    evals = {r["step"]: r for r in map(json.loads, f) if r["split"] == "eval"}
  for step in reading.committed_steps(run):
    metrics = reading.read_meta(run, step)["metrics"]
    assert metrics["eval_step"] == step
    assert metrics["eval_loss"] == evals[step]["loss"]
    assert metrics["eval_mlm_accuracy"] == evals[step]["mlm_accuracy"]


@pytest.mark.slow
def test_best_by_a_downstream_sweep(run, tmp_path):
  """--sweep: the rows of tools/eval_checkpoints.py's checkpoint_sweep.json
  (here from a fine-tuning stand-in scoring each step), highest first."""
  tool = helpers.import_tool("eval_checkpoints")
  score = {2: 0.5, 4: 0.9, 6: 0.7}

  def finetune(config, out):
    step = config.train.init_from_step
    return dict(main_score=score[step], scores={}, task="kw")
  config = helpers.load_config("finetune")
  tool.sweep_checkpoints(config, run, str(tmp_path / "sweep"), run=finetune)
  out = str(tmp_path / "avg")
  assert _average("--workdir", run, "--best", "2", "--by", "main_score",
                  "--sweep", str(tmp_path / "sweep" / "checkpoint_sweep.json"),
                  "--output", out) == 0
  with open(os.path.join(out, "averaged.json")) as f:
    provenance = json.load(f)
  assert provenance["steps"] == [4, 6]
  assert provenance["scores"] == {"4": 0.9, "6": 0.7}


@pytest.mark.slow
def test_averaged_workdir_exports_with_pytorch_parity(run, tmp_path):
  import jax
  import torch
  from flax import nnx
  from transformers import AutoTokenizer
  from transformers import BertForPreTraining

  from bert_jax import to_hf
  from bert_jax.families import bert as bert_family
  from bert_jax.hf import mapping
  out, hf = str(tmp_path / "avg"), str(tmp_path / "hf")
  assert _average("--workdir", run, "--steps", "4,6", "--output", out) == 0
  assert to_hf.main(["--workdir", out, "--output", hf]) == 0
  params, config, _ = _params(out)
  model = BertForPreTraining.from_pretrained(hf).eval()
  tok = AutoTokenizer.from_pretrained(hf)
  batch = tok(["the function returns a value .", "a list of items"],
              ["it is called here .", "of the module"], padding=True,
              return_tensors="np")
  with torch.no_grad():
    theirs = model(**{k: torch.as_tensor(v) for k, v in batch.items()})
  graphdef, state = nnx.split(mapping.make_model(params, config.model,
                                                 bert_family.BERT))
  ours = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))(state, *(
      np.asarray(batch[k], np.int32)
      for k in ("input_ids", "attention_mask", "token_type_ids")))
  n = model.config.vocab_size
  np.testing.assert_allclose(theirs.prediction_logits.numpy(),
                             np.asarray(ours["mlm_logits"])[..., :n],
                             atol=1e-4, rtol=1e-4)
  np.testing.assert_allclose(theirs.seq_relationship_logits.numpy(),
                             np.asarray(ours["nsp_logits"]), atol=1e-4)


@pytest.mark.slow
def test_averaged_workdir_fine_tunes(run, tmp_path):
  """train.init_from=the averaged workdir: its encoder is the average's."""
  import csv

  from bert_jax import pretrained
  from bert_jax.downstream import finetuning
  out = str(tmp_path / "avg")
  assert _average("--workdir", run, "--steps", "2,6", "--output", out) == 0
  rows = [[f"the value {'good' if i % 2 else 'bad'} here", i % 2]
          for i in range(32)]
  for name in ("train", "dev"):
    with open(tmp_path / f"{name}.csv", "w", newline="") as f:
      w = csv.writer(f)
      w.writerow(["text", "label"])
      w.writerows(rows)
  config = helpers.load_config("finetune")
  config.data.seq_length = 32
  config.task.update(name="words", train_file=str(tmp_path / "train.csv"),
                     validation_file=str(tmp_path / "dev.csv"),
                     text_field="text", buckets=(32,))
  config.train.update(init_from=out, num_steps=2, batch_size=16,
                      log_every=1000)
  source = pretrained.resolve(out)
  assert (source.kind, source.step) == ("workdir", 6)
  results = finetuning.run(config, str(tmp_path / "ft"))
  assert 0.0 <= results["main_score"] <= 1.0


# ------------------------------------------------------------------------------
# Refusals: one line, exit 1, nothing written.
# ------------------------------------------------------------------------------
def _meta_path(workdir, step):
  return os.path.join(workdir, "checkpoints", str(step), "meta", "metadata")


@pytest.fixture()
def odd_steps(run, tmp_path):
  """A copy of the run with step 8 of another objective and step 10 of
  other parameter shapes (made by the averaging itself), and another run
  beside it."""
  from bert_jax.checkpoints import averaging
  from bert_jax.checkpoints import reading
  work = str(tmp_path / "odd")
  shutil.copytree(run, work)
  ckpts = os.path.join(work, "checkpoints")
  shutil.copytree(os.path.join(ckpts, "6"), os.path.join(ckpts, "8"))
  with open(_meta_path(work, 8)) as f:
    meta = json.load(f)
  meta["config"]["objective"]["name"] = "electra"
  with open(_meta_path(work, 8), "w") as f:
    json.dump(meta, f)
  params, config, _ = reading.load_params(run, 6)
  params["bert"]["pooler"]["bias"] = np.zeros(3, np.float32)
  other = str(tmp_path / "other_shapes")
  averaging.write(other, averaging.Choice(os.path.abspath(run), (10,)),
                  params, config.to_dict())
  shutil.copytree(os.path.join(other, "checkpoints", "10"),
                  os.path.join(ckpts, "10"))
  second = str(tmp_path / "second")
  shutil.copytree(run, second)
  return dict(work=work, second=second)


@pytest.mark.parametrize("args, message", [
    (("--steps", "4,8"), r"^error: Steps 4 and 8 were trained with different "
     r"objectives \(objective.name 'bert' and 'electra'\)"),
    (("--steps", "6,10"), r"^error: Steps 6 and 10 hold different "
     r"parameters: params/bert/pooler/bias is \(64,\) in step 6 and "
     r"\(3,\) in step 10\.$"),
    (("--steps", "4,SECOND/checkpoints/6"), r"^error: --steps: .*second/"
     r"checkpoints/6 is a step of another run \(.*second\), not of .*odd: "
     r"average the steps of one run\.$"),
    (("--steps", "3,4"), r"^error: --steps: 3 is not a committed step of "),
    (("--best", "4", "--by", "eval_loss", "--after_step", "2"),
     r"^error: --best 4 --by eval_loss: only 2 committed steps with their "
     r"own eval_loss in their meta"),
    (("--steps", "4", "--best", "2"), r"^error: Give either --steps or "),
])
@pytest.mark.slow
def test_bad_choices_are_one_line_and_write_nothing(odd_steps, tmp_path,
                                                    capsys, args, message):
  out = tmp_path / "never"
  args = [a.replace("SECOND", odd_steps["second"]) for a in args]
  assert _average("--workdir", odd_steps["work"], *args,
                  "--output", str(out)) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and __import__("re").match(message, err[0]), err
  assert not out.exists()
  assert not [p for p in os.listdir(tmp_path) if p.startswith("never")]


@pytest.mark.slow
def test_existing_output_is_refused(run, tmp_path, capsys):
  out = tmp_path / "taken"
  out.mkdir()
  (out / "file").write_text("mine")
  assert _average("--workdir", run, "--steps", "2,4", "--output",
                  str(out)) == 1
  assert capsys.readouterr().err.startswith(f"error: --output {out} exists")
  assert os.listdir(out) == ["file"]
