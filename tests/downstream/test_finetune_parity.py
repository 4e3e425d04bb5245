"""Fine-tuning dynamics equal an independent implementation's.

From identical weights (a tiny random BERT directory plus our freshly
initialized classifier, exported together as a BertForSequenceClassification
directory) on identical batches (taken from our task_data train iterator and
saved as numpy), 50 steps of our real train step (`steps_lib.Programs` with the
`classify` objective) give the same per-step loss as Hugging Face PyTorch
`BertForSequenceClassification` trained by a loop written here with
`torch.optim.AdamW` (no decay on biases and LayerNorm, eps and betas from the
config), `LambdaLR` linear warmup + linear decay, and global-norm clipping
at 1.0 with the norm in float64. fp32, dropout 0. The reference imports
nothing from bert_jax: it reads the directory and the saved batches.
"""

import os

import jax
import numpy as np
import pytest

from tests.helpers import tiny_models
from tests.helpers import torch_reference

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NUM_STEPS = 50
TOLERANCE = 1e-5  # Relative, per step.
# The fresh classifier's std over the usual 0.02: larger logits and
# gradients, so that global-norm clipping at 1.0 acts in many steps.
CLASSIFIER_SCALE = 10.0


# -----------------------------------------------------------------------------
# Ours: the real train step on the task's batches.
# -----------------------------------------------------------------------------
def _our_run(base):
  """Trains NUM_STEPS with our train step; returns (hparams, losses,
  grad norms, export dir of the initial params, saved batches path)."""
  from bert_jax import compose
  from bert_jax import pretrained
  from bert_jax.data import tokenizers
  from bert_jax.downstream import finetuning
  from bert_jax.hf import checkpoint_io
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib

  hf = tiny_models.make_hf_dir(os.path.join(base, "base"))
  train_file, dev_file = tiny_models.write_keyword_task(
      os.path.join(base, "task"), n_train=256, n_dev=16)
  config = tiny_models.finetune_config(hf["out"], train_file, dev_file,
                                       num_steps=NUM_STEPS,
                                       learning_rate=5e-4)
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_probs_dropout_prob = 0.0
  source = pretrained.resolve(config.train.init_from)
  spec, train_rows, eval_rows = finetuning.read_task(config, base)
  config = finetuning.resolve_config(config, source, spec, len(train_rows))
  tok_spec = pretrained.tokenizer_spec(source)
  tok = tokenizers.load(tok_spec.path, tok_spec.kind, tok_spec.lower_case)
  task_input = finetuning.task_input(config, tok, spec, train_rows, eval_rows)

  mesh = sharding.make_mesh(config.mesh)
  programs = steps_lib.Programs(config, mesh, compose.objective(config))
  with programs.context():
    state = programs.init()
  params = finetuning.encoder_init(source, config, state["params"],
                                   programs.abstract_state["params"])
  params["classifier"] = dict(
      params["classifier"],
      kernel=params["classifier"]["kernel"] * CLASSIFIER_SCALE)
  state = dict(state, params=params)
  init_dir = os.path.join(base, "init_hf")
  checkpoint_io.save_hf_model(init_dir, jax.device_get(state["params"]),
                              config.model, table=compose.task_table("bert", "sentence"),
                              tokenizer=tok_spec)

  batches = [next(task_input.train_iter) for _ in range(NUM_STEPS)]
  batch_path = os.path.join(base, "batches.npz")
  torch_reference.save_batches(batch_path, batches)
  losses, norms = [], []
  for local in batches:
    batch = sharding.global_batch(local, programs.batch_sharding)
    with programs.context():
      state, metrics = programs.train_step(state, batch)
    metrics = jax.device_get(metrics)
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
  t = config.train
  hparams = dict(lr=t.learning_rate, warmup=int(t.warmup_steps),
                 steps=int(t.num_steps), betas=(t.adam_b1, t.adam_b2),
                 eps=t.adam_eps, weight_decay=t.weight_decay,
                 max_grad_norm=t.max_grad_norm)
  return hparams, np.array(losses), np.array(norms), init_dir, batch_path


# -----------------------------------------------------------------------------
# Reference: Hugging Face PyTorch, nothing from bert_jax.
# -----------------------------------------------------------------------------
def _classification_loss(model, b):
  """HF BertForSequenceClassification's logits, our weighted mean CE."""
  logits = model(input_ids=b["input_ids"].long(),
                 attention_mask=b["input_mask"].long(),
                 token_type_ids=b["segment_ids"].long()).logits
  w = b["example_weights"].float()
  nll = torch.nn.functional.cross_entropy(logits, b["labels"].long(),
                                          reduction="none")
  return (w * nll).sum() / w.sum().clamp(min=1.0)


def reference_losses(model_dir, batch_path, **hparams):
  """Per-step losses of HF BertForSequenceClassification + torch AdamW
  (tests/helpers/torch_reference.py: the loop every parity test shares)."""
  model = transformers.BertForSequenceClassification.from_pretrained(
      model_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      attn_implementation="eager", dtype=torch.float32)
  return torch_reference.train_losses(model, batch_path, _classification_loss,
                                      **hparams)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  return _our_run(str(tmp_path_factory.mktemp("ft_parity")))


def test_per_step_loss_equals_pytorch(runs):
  hparams, ours, norms, init_dir, batch_path = runs
  assert len(ours) == NUM_STEPS and hparams["warmup"] > 0
  # Clipping is exercised (else the test could not see it).
  assert np.sum(norms > hparams["max_grad_norm"]) >= 5, norms
  theirs = reference_losses(init_dir, batch_path, **hparams)
  rel = np.abs(ours - theirs) / np.abs(theirs)
  print(f"losses {ours[0]:.5f} -> {ours[-1]:.5f}; max relative difference "
        f"over {NUM_STEPS} steps {rel.max():.3g} (step {rel.argmax()})")
  assert ours[-10:].mean() < ours[:10].mean()  # It learns.
  assert rel.max() < TOLERANCE, rel


def test_parity_sees_a_wrong_optimizer(runs):
  """The comparison can fail: no clipping, or eps 1e-8, on the reference
  side breaks it."""
  hparams, ours, _, init_dir, batch_path = runs
  for change in (dict(clip=False), dict(eps=1e-8)):
    theirs = reference_losses(init_dir, batch_path, **{**hparams, **change})
    rel = np.abs(ours - theirs) / np.abs(theirs)
    assert rel.max() > 10 * TOLERANCE, (change, rel.max())
