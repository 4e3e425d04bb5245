"""Token-tagging and QA fine-tuning equal independent implementations, and
shard like one device.

Parity: from identical weights (a tiny random BERT plus our fresh head,
exported together as BertForTokenClassification / BertForQuestionAnswering)
on identical batches (our feature iterator's, saved as numpy), 30 steps of
our real train step give the per-step loss of Hugging Face PyTorch trained by
`tests/helpers/torch_reference` (torch AdamW, the same schedule, float64-norm
clipping), within 1e-5 relative; fp32, dropout 0. The reference's losses are
written here from the batch alone: token tagging, cross-entropy over the
positions of label_weights 1; QA, (CE(start) + CE(end)) / 2 with padding
positions masked. The fresh head's init is scaled up so that clipping acts.

Meshes: 3 train steps of each objective on 8 simulated CPU devices (DP x
FSDP x TP) equal 1 device within 1e-5 (this file run as a script in a child
whose XLA_FLAGS are set before jax is imported).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers
from tests.helpers import span_tag_tasks
from tests.helpers import tiny_models
from tests.helpers import torch_reference

pytestmark = pytest.mark.slow

NUM_STEPS = 30
TOLERANCE = 1e-5
HEAD_SCALE = 10.0
KINDS = {
    "token": dict(head="classifier", seq=32,
                  lr=1e-4, hf_class="BertForTokenClassification"),
    "span": dict(head="qa_outputs", seq=64, lr=1e-4,
                 hf_class="BertForQuestionAnswering"),
}


def _our_run(base, kind):
  """NUM_STEPS of our train step; returns hparams, losses, grad norms, the
  HF dir of the initial params and the saved batches."""
  import jax

  from bert_jax import compose
  from bert_jax import pretrained
  from bert_jax.data import tokenizers
  from bert_jax.downstream import finetuning
  from bert_jax.hf import checkpoint_io
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  spec = KINDS[kind]
  hf = tiny_models.make_hf_dir(os.path.join(base, "base"))
  if kind == "token":
    train, dev = span_tag_tasks.write_tagging_task(
        os.path.join(base, "data"), n_train=120, n_dev=4)
  else:
    train, dev = span_tag_tasks.write_qa_task(os.path.join(base, "data"),
                                              n_train=120, n_dev=4)
  config = tiny_models.finetune_config(hf["out"], train, dev,
                                       num_steps=NUM_STEPS,
                                       learning_rate=spec["lr"])
  config.task.update(name="generated", kind=kind, buckets=(16, 32, 64),
                     doc_stride=24)
  config.data.seq_length = spec["seq"]
  config.train.update(warmup_steps=5, warmup_fraction=0.0)
  config.model.update(hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
  source = pretrained.resolve(config.train.init_from)
  task, train_rows, evals = finetuning.read_task(config, base)
  tok_spec = pretrained.tokenizer_spec(source)
  tok = tokenizers.load(tok_spec.path, tok_spec.kind, tok_spec.lower_case)
  inputs = finetuning.task_input(config, tok, task, train_rows, evals)
  config = finetuning.resolve_config(config, source, task, inputs.num_train)
  mesh = sharding.make_mesh(config.mesh)
  programs = steps_lib.Programs(config, mesh, compose.objective(config))
  with programs.context():
    state = programs.init()
  params = finetuning.encoder_init(source, config, state["params"],
                                   programs.abstract_state["params"])
  head = dict(params[spec["head"]])
  head["kernel"] = head["kernel"] * HEAD_SCALE
  params[spec["head"]] = head
  state = dict(state, params=params)
  init_dir = os.path.join(base, "init_hf")
  checkpoint_io.save_hf_model(init_dir, jax.device_get(params), config.model,
                              table=compose.task_table("bert", kind),
                              tokenizer=tok_spec)
  batches = [next(inputs.train_iter) for _ in range(NUM_STEPS)]
  if kind == "token":  # Two bucket lengths; QA windows have padding.
    assert len({b["input_ids"].shape[1] for b in batches}) > 1
  assert min(b["input_mask"].min() for b in batches) == 0
  batch_path = torch_reference.save_batches(
      os.path.join(base, "batches.npz"), batches)
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


def _torch_inputs(b):
  return dict(input_ids=b["input_ids"].long(),
              attention_mask=b["input_mask"].long(),
              token_type_ids=b["segment_ids"].long())


def tagging_loss(model, b):
  import torch
  logits = model(**_torch_inputs(b)).logits
  nll = torch.nn.functional.cross_entropy(
      logits.flatten(0, 1), b["labels"].long().flatten(), reduction="none")
  w = b["label_weights"].float().flatten()
  return (w * nll).sum() / w.sum().clamp(min=1.0)


def qa_loss(model, b):
  import torch
  out = model(**_torch_inputs(b))
  pad = b["input_mask"] == 0
  nll = 0
  for logits, pos in ((out.start_logits, b["start_positions"]),
                      (out.end_logits, b["end_positions"])):
    logits = logits.masked_fill(pad, -1e4)
    nll = nll + 0.5 * torch.nn.functional.cross_entropy(
        logits, pos.long(), reduction="none")
  w = b["example_weights"].float()
  return (w * nll).sum() / w.sum().clamp(min=1.0)


def _reference(kind, init_dir, batch_path, **hparams):
  transformers = pytest.importorskip("transformers")
  import torch
  model = getattr(transformers, KINDS[kind]["hf_class"]).from_pretrained(
      init_dir, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
      attn_implementation="eager", dtype=torch.float32)
  loss_fn = tagging_loss if kind == "token" else qa_loss
  return torch_reference.train_losses(model, batch_path, loss_fn, **hparams)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_per_step_loss_equals_pytorch(kind, tmp_path):
  pytest.importorskip("torch")
  hparams, ours, norms, init_dir, batch_path = _our_run(str(tmp_path), kind)
  assert np.sum(norms > hparams["max_grad_norm"]) >= 5, norms  # clipping
  theirs = _reference(kind, init_dir, batch_path, **hparams)
  rel = np.abs(ours - theirs) / np.abs(theirs)
  print(f"{kind}: losses {ours[0]:.5f} -> {ours[-1]:.5f}; max relative "
        f"difference over {NUM_STEPS} steps {rel.max():.3g}")
  assert ours[-5:].mean() < ours[:5].mean()  # It learns.
  assert rel.max() < TOLERANCE, rel
  if kind != "token":
    return
  # The comparison can fail: the reference without clipping drifts away.
  unclipped = _reference(kind, init_dir, batch_path,
                         **dict(hparams, clip=False))
  assert np.max(np.abs(ours - unclipped) / np.abs(unclipped)) > 10 * TOLERANCE


# --- 8 simulated devices -----------------------------------------------------
MESHES = {"single": (1, 1, 1), "dp2_fsdp2_tp2": (2, 2, 2)}


def _batch(kind, step, batch=16, seq=32, vocab=89, labels=5):
  r = np.random.RandomState(100 + step)
  lengths = r.randint(4, seq + 1, size=batch)
  lengths[-2:] = 0  # padding rows of an eval batch
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  out = dict(input_ids=(r.randint(5, vocab, (batch, seq)) * mask).astype(
      np.int32), input_mask=mask,
             segment_ids=((np.arange(seq)[None] >= 3) * mask).astype(
                 np.int32))
  if kind == "token":
    out.update(labels=r.randint(0, labels, (batch, seq)).astype(np.int32),
               label_weights=(mask * (r.rand(batch, seq) > 0.4)).astype(
                   np.float32))
  else:
    s = (r.rand(batch) * np.maximum(lengths, 1)).astype(np.int32)
    out.update(start_positions=s,
               end_positions=np.minimum(s + 2, np.maximum(lengths - 1, 0))
               .astype(np.int32),
               example_weights=(lengths > 0).astype(np.float32))
  return out


def child_main(out_path):
  import jax

  from bert_jax import compose
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  assert jax.device_count() == 8
  out = {}
  for kind, objective in (("token", "token_classify"), ("span", "span_qa")):
    for name, (data, fsdp, tensor) in MESHES.items():
      config = tiny_models.tiny_model_config(89)
      config.objective.name = objective
      config.model.update(num_labels=5 if kind == "token" else 2,
                          **helpers.NO_DROPOUT)
      config.train.update(batch_size=16, learning_rate=1e-3, warmup_steps=1,
                          num_steps=10)
      config.mesh.update(data=data, fsdp=fsdp, tensor=tensor)
      devices = jax.devices()[:data * fsdp * tensor]
      programs = steps_lib.Programs(
          config, sharding.make_mesh(config.mesh, devices),
          compose.objective(config))
      with programs.context():
        state = programs.init()
        losses = []
        for step in range(3):
          batch = sharding.global_batch(_batch(kind, step),
                                        programs.batch_sharding)
          state, metrics = programs.train_step(state, batch)
          losses.append(float(metrics["loss"]))
      out[f"{kind}/{name}"] = np.array(losses)
  np.savez(out_path, **out)


def test_both_heads_on_8_devices_equal_one(tmp_path):
  out = str(tmp_path / "losses.npz")
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), out],
                        env=helpers.child_env(devices=8), cwd=helpers.REPO,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-4000:]
  losses = np.load(out)
  for kind in KINDS:
    single = losses[f"{kind}/single"]
    assert single[0] > 0.3, single
    for name in MESHES:
      np.testing.assert_allclose(losses[f"{kind}/{name}"], single, rtol=1e-5,
                                 atol=1e-6, err_msg=f"{kind}/{name}")


if __name__ == "__main__":
  child_main(sys.argv[1])
