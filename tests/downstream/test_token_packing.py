"""Token tagging on packed rows (data.packing): each sentence as if alone.

Sentences of NER-like lengths (ModernBERT's local layers see a window
shorter than most) run one a row (padded) and several a row (packed by
``data/feature_packing.py``): per sentence, the tag logits the token kind
predicts equal those it gets alone, and the loss and its gradients on the
packed batch equal the padded batch's, for BERT and ModernBERT with every
attention kind that runs here. Changing the first sentence of each row
leaves the others' logits bit for bit unchanged.

Fine-tuning runs on the generated tagging task (CoNLL-2003's mean sentence
length): packed evaluation writes the buckets' predictions file byte for
byte; packed fine-tuning reaches the buckets' entity F1 over 3 seeds; a
packed run gives the same losses on 1 and 8 devices and resumes exactly
after kill -9.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import tasks
from bert_jax.data import feature_batches
from bert_jax.data import feature_packing
from bert_jax.downstream import finetuning
from bert_jax.training import steps as steps_lib
from tests import helpers
from tests.helpers import family_checks
from tests.helpers import in_process
from tests.helpers import packed_rows
from tests.helpers import span_tag_tasks
from tests.helpers import tiny_models

SEQ, HEADS, HEAD_DIM, VOCAB, LABELS, S = 128, 2, 64, 97, 5, 4
LENGTHS = (37, 50, 30, 60, 45, 20, 9, 3, 14)
IMPLS = ("xla", "dot_product_attention", "splash")
SEEDS = (0, 1, 2)


def _config(family: str, impl: str, packing: bool):
  config = config_lib.get_config("tiny")
  config.objective.update(name=tasks.get("token").objective, encoder=family)
  config.model.update(vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM,
                      num_attention_heads=HEADS, intermediate_size=256,
                      num_hidden_layers=2, max_position_embeddings=SEQ,
                      num_labels=LABELS, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, attention_impl=impl,
                      splash_interpret=True)
  if family == "modernbert":  # Global, local, local; a 16-token window.
    config.model.update(family_checks.MODERNBERT_TINY, local_attention=16)
  config.data.update(seq_length=SEQ, packing=packing,
                     packing_max_sequences=S)
  return config


def _features() -> feature_batches.Features:
  """[CLS] tokens [SEP] windows with a tag and a weight per token (0 at the
  specials and at some later sub-tokens)."""
  r = np.random.RandomState(0)
  n = len(LENGTHS)
  real = np.arange(SEQ)[None] < np.asarray(LENGTHS)[:, None]
  ids = np.where(real, r.randint(5, VOCAB, (n, SEQ)), 0)
  ids[:, 0] = 2
  ids[np.arange(n), np.asarray(LENGTHS) - 1] = 3
  inner = real & (ids > 3)
  return feature_batches.Features(
      ids.astype(np.int32), np.asarray(LENGTHS, np.int32),
      dict(labels=np.where(real, r.randint(0, LABELS, (n, SEQ)), 0).astype(
          np.int32),
           label_weights=(inner & (r.rand(n, SEQ) < 0.8)).astype(np.float32)))


def _batches():
  features = _features()
  shape = feature_packing.Shape(SEQ, S, window=64)
  rows = feature_packing.best_fit_decreasing(features.lengths, SEQ, S)
  packed = feature_packing.pack(features, rows, shape, pad_id=0)
  assert len(packed["input_ids"]) < len(LENGTHS) / 2
  padded = features.rows(np.arange(len(LENGTHS)), SEQ, pad_id=0)
  return padded, packed


def _runner(config, graphdef):
  objective = compose.objective(config)
  names = objective.feature_spec(config)

  def run(params, batch):
    batch = {k: batch[k] for k in names}
    loss, grads = jax.value_and_grad(lambda p: steps_lib.batch_loss(
        p, batch, graphdef=graphdef, config=config, objective=objective))(
            params)
    out = objective.predict(nnx.merge(graphdef, params), batch, config)
    return out["logits"], loss, grads

  return jax.jit(run)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_packed_sentences_get_the_tags_losses_and_gradients_of_each_alone(
    family, impl):
  padded, packed = _batches()
  pad_config = _config(family, impl, False)
  pack_config = _config(family, impl, True)
  model = compose.objective(pad_config).make_model(pad_config, nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  alone, loss_pad, grads_pad = _runner(pad_config, graphdef)(params, padded)
  run_packed = _runner(pack_config, graphdef)
  together, loss_pack, grads_pack = run_packed(params, packed)
  together, alone = np.asarray(together), np.asarray(alone)
  assert together.shape == (len(packed["input_ids"]), S, SEQ, LABELS)
  for r, s in zip(*np.nonzero(packed["example_weights"])):
    i = int(packed["example_index"][r, s])
    n = LENGTHS[i]
    np.testing.assert_allclose(together[r, s, :n], alone[i, :n], atol=1e-5,
                               rtol=0, err_msg=str(i))
    assert not together[r, s, n:].any()
  assert not together[packed["example_weights"] == 0].any()
  # The same labelled tokens, the same sums and counts: the same loss and
  # gradients.
  packed_rows.assert_same_loss_and_grads(loss_pack, grads_pack, loss_pad,
                                         grads_pad)
  # Another first sentence in each row changes none of the others' tags.
  changed = dict(packed)
  first = packed["sequence_ids"] == 1
  changed["input_ids"] = np.where(first, (packed["input_ids"] + 7) % VOCAB,
                                  packed["input_ids"])
  other = np.asarray(run_packed(params, changed)[0])
  np.testing.assert_array_equal(other[:, 1:], together[:, 1:])
  assert not np.allclose(other[:, 0], together[:, 0])


# --- Fine-tuning runs on packed rows ------------------------------------------
# The generated tagging task (tests/helpers/span_tag_tasks) with sentences of
# CoNLL-2003's mean length: several a 64-token row.
TASK_SEQ = 64


@pytest.fixture(scope="module")
def ner(tmp_path_factory):
  base = tmp_path_factory.mktemp("token_packing")
  hf = tiny_models.make_hf_dir(str(base / "base"))
  train, dev = span_tag_tasks.write_tagging_task(str(base / "task"),
                                                 lengths="conll")
  return dict(base=base, hf=hf["out"], train=train, dev=dev)


def ner_config(ner, packed: bool, **train):
  config = tiny_models.finetune_config(ner["hf"], ner["train"], ner["dev"],
                                       learning_rate=5e-3)
  config.task.update(name="generated_tags", kind="token", buckets=(32, 64))
  config.data.update(seq_length=TASK_SEQ, packing=packed,
                     packing_max_sequences=8, packing_window=128)
  config.train.update(dict(dict(log_every=1, warmup_steps=10,
                                warmup_fraction=0.0), **train))
  return config


def _lines(path):
  with open(path) as f:
    return f.read()


@pytest.mark.slow
def test_packed_evaluation_writes_the_predictions_of_buckets(ner):
  """The same params (learning rate 0: the checkpoint's encoder, the
  seed's head) evaluated on packed rows and on length buckets: the same
  conlleval file, byte for byte, and the same scores."""
  out = {}
  for packed in (False, True):
    config = ner_config(ner, packed, learning_rate=0.0, num_steps=2,
                        batch_size=8, warmup_steps=0)
    workdir = str(ner["base"] / f"lr0_{packed}")
    out[packed] = (finetuning.run(config, workdir), workdir)
  (buckets, bdir), (packed, pdir) = out[False], out[True]
  assert packed["scores"] == buckets["scores"]
  assert packed["eval_examples"] == buckets["eval_examples"] == {
      "validation": 100}
  path = os.path.join("predictions", "validation", "predictions.conll")
  assert _lines(os.path.join(pdir, path)) == _lines(os.path.join(bdir, path))


@pytest.mark.slow
def test_packed_ner_finetuning_matches_buckets_over_three_seeds(
    ner, optimized):
  scores = {}
  for packed in (False, True):
    for seed in SEEDS:
      # 5 epochs; ~4 sentences fill a 64-token row, so 4 packed rows a
      # step train on about the 16 sentences of a bucketed step.
      config = ner_config(ner, packed, num_steps=0, num_epochs=5.0,
                          seed=seed, batch_size=4 if packed else 16,
                          log_every=1000)
      results = finetuning.run(config, str(ner["base"] /
                                           f"f1_{packed}_{seed}"))
      scores[packed, seed] = results["scores"]["validation"]["f1"]
  buckets = np.array([scores[False, s] for s in SEEDS])
  packed = np.array([scores[True, s] for s in SEEDS])
  assert buckets.min() >= 0.9, scores  # Learned.
  # Within seed noise: the packed mean within the buckets' spread (+ 2%),
  # the tolerance of the sentence tasks' test (test_finetune_packing).
  assert abs(packed.mean() - buckets.mean()) <= max(
      2 * buckets.std(), 0.02), scores


def _flags(ner, workdir, *extra):
  """`python -m bert_jax.finetune`'s arguments for the packed NER run."""
  c = ner_config(ner, True)
  return ["--config",
          os.path.join(helpers.REPO, "configs", "ner.py"), "--workdir",
          workdir, f"--config.task.name={c.task.name}",
          f"--config.task.train_file={c.task.train_file}",
          f"--config.task.validation_file={c.task.validation_file}",
          f"--config.train.init_from={c.train.init_from}",
          f"--config.data.seq_length={TASK_SEQ}", "--config.data.packing=True",
          "--config.data.packing_max_sequences=8",
          "--config.data.packing_window=128", "--config.model.dtype=float32",
          "--config.model.hidden_dropout_prob=0.0",
          "--config.model.attention_probs_dropout_prob=0.0",
          "--config.train.batch_size=8", "--config.train.learning_rate=5e-3",
          "--config.train.warmup_steps=2", "--config.train.warmup_fraction=0",
          "--config.train.log_every=1", *extra]


@pytest.mark.slow
def test_packed_ner_runs_the_same_on_one_and_eight_devices(ner):
  """The whole run (packed input, steps, evaluation) on 8 simulated devices,
  data x fsdp, gives the one-device run's losses and scores (that run in
  this process, the 8-device one in a child)."""
  runs = {}
  for name, mesh in (("single", ()), ("dp2_fsdp4", (
      "--config.mesh.data=2", "--config.mesh.fsdp=4"))):
    workdir = str(ner["base"] / f"mesh_{name}")
    args = _flags(ner, workdir, "--config.train.num_steps=6", *mesh)
    if mesh:
      proc = subprocess.run(
          [sys.executable, "-m", "bert_jax.finetune", *args],
          cwd=helpers.REPO, env=helpers.child_env(devices=8),
          capture_output=True, text=True, timeout=900)
    else:
      proc = in_process.run_module("finetune", *args)
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(workdir, "results.json")) as f:
      runs[name] = (helpers.train_records(workdir), json.load(f)["scores"])
  (one, one_scores), (eight, eight_scores) = runs["single"], runs["dp2_fsdp4"]
  assert [r["step"] for r in eight] == [r["step"] for r in one] == list(
      range(1, 7))
  np.testing.assert_allclose([r["loss"] for r in eight],
                             [r["loss"] for r in one], rtol=1e-5)
  for k, v in one_scores["validation"].items():
    assert eight_scores["validation"][k] == pytest.approx(v, abs=1e-6), k


@pytest.mark.slow
def test_packed_ner_run_resumes_exactly_after_kill9(ner):
  """Killed with SIGKILL after step 7 (checkpoint 5), the rerun redoes
  steps 6-7 with the killed run's losses bit for bit: the packed rows not
  yet fed are part of the checkpoint."""
  workdir = str(ner["base"] / "kill9")
  args = _flags(ner, workdir, "--config.train.num_steps=14",
                "--config.checkpoint.save_every_steps=5",
                "--config.checkpoint.async_save=False")
  helpers.assert_resumes_exactly_after_kill9(
      "finetune", args, workdir, kill_after=7, save_every=5, num_steps=14)
