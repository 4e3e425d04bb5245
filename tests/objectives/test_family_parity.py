"""Training dynamics of ALBERT, DistilBERT distillation, ELECTRA, ModernBERT
and RoBERTa equal independent Hugging Face PyTorch implementations, step by
step.

As tests/downstream/test_finetune_parity.py does for fine-tuning: from
identical weights (our freshly initialized params, exported as Hugging Face
directories) on identical batches (synthetic pretraining batches saved as
numpy), NUM_STEPS steps of our real train step (`steps_lib.Programs` with the
family's objective) give the same per-step loss as a loop written here over
the Hugging Face PyTorch models, trained with `torch.optim.AdamW` (no decay
on biases and LayerNorms), `LambdaLR` linear warmup + linear decay and
global-norm clipping with the norm in float64. fp32, dropout 0. The
reference side imports nothing from bert_jax: it reads the exported
directories and the saved arrays.

- albert: `AlbertForPreTraining` with its own loss (`labels` with -100 off
  the masked positions + `sentence_order_label`), which is our MLM sum /
  masked count + SOP mean when positions are distinct and weights 0/1.
- distil: `DistilBertForMaskedLM` student (trained) and `BertForMaskedLM`
  teacher (frozen), the loss of Hugging Face research_projects/distillation
  distiller.py with --restrict_ce_to_mask (KLDivLoss(batchmean) x T^2 on the
  masked positions, CrossEntropyLoss(ignore_index=-100), CosineEmbeddingLoss
  on real tokens' last hidden states). Our soft-target term is the cross-
  entropy, i.e. that KL plus the teacher's entropy (same gradient); the
  reference adds the entropy (computed from its own teacher) to compare.
- electra: `ElectraForMaskedLM` generator and `ElectraForPreTraining`
  discriminator sharing one `ElectraEmbeddings` module (tied here in torch),
  loss = MLM + 50 x BCE over real tokens. The generator samples
  argmax(logits / T + Gumbel noise) on both sides, with the noise of our
  step's rng (`objectives.electra.sampling_noise`) handed over as numpy.
  The generator may sample [PAD], a real input token of the discriminator
  then: its embedding row trains from that lookup in ours (as in Google's
  TF ELECTRA), so the reference drops torch's `padding_idx` (kept, the
  generator's loss drifts 3e-5 in these 20 steps). Each network's loss is
  compared too: 50 x BCE dominates the total.

- roberta: `RobertaForMaskedLM` with its own loss, its positions counted
  from the padding id as ours (`model.positions_from_pad`).

Each family also has a check that the comparison fails on a wrong reference.
Max relative differences measured (20 steps): albert 6e-7, distil 2e-7,
electra 3.9e-6 (discriminator BCE 4.7e-6, generator MLM 4e-7), roberta 1e-6.
"""

import math
import os

import jax
import numpy as np
import pytest
from bert_jax.families import albert as albert_family
from bert_jax.families import modernbert as modernbert_family
from tests.helpers import torch_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

NUM_STEPS = 20
TOLERANCE = 1e-5  # Relative, per step.
BATCH, SEQ, PREDS = 16, 32, 5
MASK_ID = 4  # [MASK] in tests/tiny_models' vocabulary, and here throughout.
TRAIN = dict(batch_size=BATCH, num_steps=NUM_STEPS, warmup_steps=5,
             learning_rate=2e-3, weight_decay=0.1, optimizer="adamw",
             max_grad_norm=1.0, grad_accum_steps=1)


# -----------------------------------------------------------------------------
# Batches: distinct masked positions, 0/1 weights, padded slots and rows.
# -----------------------------------------------------------------------------
def masked_batches(n, vocab, *, seed, two_segments, mask_share=0.8,
                   random_share=0.1):
  """`n` pretraining batches (features.PRETRAINING shapes and dtypes)."""
  r = np.random.RandomState(seed)
  zipf = 1.0 / np.arange(1, vocab - 4)
  zipf /= zipf.sum()
  out = []
  for _ in range(n):
    lengths = r.randint(SEQ // 2, SEQ + 1, size=BATCH)
    mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    # Zipf-like token frequencies: a unigram distribution to learn.
    original = (5 + r.choice(vocab - 5, (BATCH, SEQ), p=zipf)) * mask
    original[:, 0] = 2  # [CLS]
    segments = (np.arange(SEQ)[None] >= lengths[:, None] // 2) * mask
    pos = np.zeros((BATCH, PREDS), np.int32)
    w = np.zeros((BATCH, PREDS), np.float32)
    inputs = original.copy()
    for b in range(BATCH):
      k = r.randint(1, PREDS + 1)
      pos[b, :k] = np.sort(r.choice(np.arange(1, lengths[b]), k,
                                    replace=False))
      w[b, :k] = 1.0
      for p in pos[b, :k]:
        u = r.rand()
        if u < mask_share:
          inputs[b, p] = MASK_ID
        elif u < mask_share + random_share:
          inputs[b, p] = r.randint(5, vocab)
    ids = np.take_along_axis(original, pos, 1) * (w > 0)
    out.append(dict(
        input_ids=inputs.astype(np.int32), input_mask=mask,
        segment_ids=(segments if two_segments else 0 * segments).astype(
            np.int32),
        masked_lm_positions=pos, masked_lm_ids=ids.astype(np.int32),
        masked_lm_weights=w,
        next_sentence_labels=r.randint(0, 2, BATCH).astype(np.int32)))
  return out


def save_arrays(path, rows):
  np.savez(path, **{f"{i}/{k}": v for i, row in enumerate(rows)
                    for k, v in row.items()})


def load_arrays(path):
  data = np.load(path)
  n = 1 + max(int(k.split("/")[0]) for k in data.files)
  return [{k.split("/")[1]: data[k] for k in data.files
           if k.startswith(f"{i}/")} for i in range(n)]


# -----------------------------------------------------------------------------
# Ours: the real train step.
# -----------------------------------------------------------------------------
def our_run(config, batches, trace=()):
  """NUM_STEPS of `steps_lib.Programs(config).train_step` on `batches`.

  Returns (initial state as host numpy: params, frozen, rng; losses; grad
  norms; per-step values of the metrics named in `trace`).
  """
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  with programs.context():
    state = programs.warm_start(programs.init())
  init = jax.tree.map(np.array, jax.device_get(
      {k: state[k] for k in ("params", "frozen", "rng") if k in state}))
  losses, norms, traced = [], [], {k: [] for k in trace}
  for local in batches:
    batch = sharding.global_batch(local, programs.batch_sharding)
    with programs.context():
      state, metrics = programs.train_step(state, batch)
    metrics = jax.device_get(metrics)
    assert bool(metrics["finite"])
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
    for k in trace:
      traced[k].append(float(metrics[k]))
  return (init, np.array(losses), np.array(norms),
          {k: np.array(v) for k, v in traced.items()})


def run_and_export(base, config, *, seed, two_segments, table):
  """`our_run` on NUM_STEPS synthetic batches, and what the reference side
  reads: our initial params as a Hugging Face directory (`table`'s layout)
  and the batches as numpy, in `base`."""
  from bert_jax.hf import checkpoint_io
  config.train.update(TRAIN)
  batches = masked_batches(NUM_STEPS, config.model.vocab_size, seed=seed,
                           two_segments=two_segments)
  init, losses, norms, _ = our_run(config, batches)
  model_dir = os.path.join(base, "init_hf")
  checkpoint_io.save_hf_model(model_dir, init["params"], config.model,
                              table=table)
  batch_path = os.path.join(base, "batches.npz")
  save_arrays(batch_path, batches)
  return dict(hp=hparams(config), losses=losses, norms=norms,
              size=count(init["params"]), model_dir=model_dir,
              batch_path=batch_path)


def count(tree):
  return sum(int(np.size(x)) for x in jax.tree.leaves(tree))


def hparams(config):
  t = config.train
  return dict(lr=t.learning_rate, warmup=int(t.warmup_steps),
              steps=int(t.num_steps), betas=(t.adam_b1, t.adam_b2),
              eps=t.adam_eps, weight_decay=t.weight_decay,
              max_grad_norm=t.max_grad_norm)


def max_rel(ours, theirs):
  return float(np.max(np.abs(ours - theirs) / np.abs(theirs)))


def compare(name, ours, theirs, norms, hp):
  rel = np.abs(ours - theirs) / np.abs(theirs)
  print(f"{name}: losses {ours[0]:.5f} -> {ours[-1]:.5f}; max relative "
        f"difference over {len(ours)} steps {rel.max():.3g} (step "
        f"{rel.argmax()}); clipped in {np.sum(norms > hp['max_grad_norm'])}")
  assert ours[-5:].mean() < ours[:5].mean(), ours  # It learns.
  # Clipping acts in some steps (else the comparison could not see it).
  assert np.sum(norms > hp["max_grad_norm"]) >= 3, norms
  assert rel.max() < TOLERANCE, rel
  return rel


# -----------------------------------------------------------------------------
# Reference: PyTorch, nothing from bert_jax.
# -----------------------------------------------------------------------------
def load(cls, path, **dropout):
  return cls.from_pretrained(path, attn_implementation="eager",
                             dtype=torch.float32, **dropout)


class TorchOptimizer:
  """AdamW (no decay on biases and norms), warmup + linear decay, and
  global-norm clipping in float64 over the distinct parameters."""

  def __init__(self, named_params, *, lr, warmup, steps, betas, eps,
               weight_decay, max_grad_norm, decay_all=False):
    seen, decay, no_decay = set(), [], []
    for name, p in named_params:
      if id(p) in seen:
        continue
      seen.add(id(p))
      skip = not decay_all and (name.endswith("bias")
                                or "norm" in name.lower())
      (no_decay if skip else decay).append(p)
    self.params = decay + no_decay
    self.max_grad_norm = max_grad_norm
    self.opt = torch.optim.AdamW(
        [dict(params=decay, weight_decay=weight_decay),
         dict(params=no_decay, weight_decay=0.0)],
        lr=lr, betas=tuple(betas), eps=eps)

    def factor(step):
      if step < warmup:
        return step / max(1, warmup)
      return max(0.0, (steps - step) / max(1, steps - warmup))

    self.schedule = torch.optim.lr_scheduler.LambdaLR(self.opt, factor)

  def numel(self):
    return sum(p.numel() for p in self.params)

  def step(self, loss):
    self.opt.zero_grad()
    loss.backward()
    norm = math.sqrt(sum(float(p.grad.double().pow(2).sum())
                         for p in self.params if p.grad is not None))
    if norm > self.max_grad_norm:
      for p in self.params:
        if p.grad is not None:
          p.grad.mul_(self.max_grad_norm / norm)
    self.opt.step()
    self.schedule.step()
    return float(loss.detach())


def tensors(batch):
  return {k: torch.from_numpy(v) for k, v in batch.items()}


def mlm_labels(b):
  """[B, T] token labels: the original id at masked positions, else -100."""
  labels = torch.full(b["input_ids"].shape, -100, dtype=torch.long)
  rows, slots = torch.nonzero(b["masked_lm_weights"] > 0, as_tuple=True)
  labels[rows, b["masked_lm_positions"][rows, slots].long()] = (
      b["masked_lm_ids"][rows, slots].long())
  return labels


def masked_lm_inputs(b):
  """A Hugging Face masked LM's inputs for its own loss: `labels` with -100
  off the masked positions."""
  return dict(input_ids=b["input_ids"].long(),
              attention_mask=b["input_mask"].long(), labels=mlm_labels(b))


def train_with_own_loss(model, batch_path, hp, inputs=masked_lm_inputs):
  """(per-step losses, trainable param count) of a Hugging Face model
  trained on the saved batches with the loss it computes from
  `inputs(torch batch)`."""
  model.train()
  opt = TorchOptimizer(model.named_parameters(), **hp)
  losses = []
  for batch in load_arrays(batch_path):
    losses.append(opt.step(model(**inputs(tensors(batch))).loss))
  return np.array(losses), opt.numel()


def assert_perturbed_reference_breaks(ours, theirs):
  """A reference made wrong on purpose must miss ours by far more than the
  tolerance: the comparison can see the difference it is meant to see."""
  rel = max_rel(ours, theirs)
  print(f"perturbed reference: max relative difference {rel:.3g}")
  assert rel > 10 * TOLERANCE


# =============================================================================
# ALBERT: MLM + SOP.
# =============================================================================
def albert_reference(model_dir, batch_path, hp):
  torch.manual_seed(0)
  model = load(transformers.AlbertForPreTraining, model_dir,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               classifier_dropout_prob=0.0)
  return train_with_own_loss(
      model, batch_path, hp,
      lambda b: dict(masked_lm_inputs(b),
                     token_type_ids=b["segment_ids"].long(),
                     sentence_order_label=b["next_sentence_labels"].long()))


@pytest.fixture(scope="module")
def albert_run(tmp_path_factory):
  from tests.helpers import family_checks
  base = str(tmp_path_factory.mktemp("albert_parity"))
  config = family_checks.family_config("albert")
  config.data.update(max_ngram=1, max_predictions_per_seq=PREDS,
                     seq_length=SEQ)
  return run_and_export(base, config, seed=0, two_segments=True,
                        table=albert_family.ALBERT)


@pytest.mark.slow
def test_albert_per_step_loss_equals_pytorch(albert_run):
  r = albert_run
  with torch_reference.one_thread():
    theirs, numel = albert_reference(r["model_dir"], r["batch_path"], r["hp"])
  assert numel == r["size"]  # The same trainable params, tied ones once.
  compare("albert", r["losses"], theirs, r["norms"], r["hp"])


@pytest.mark.slow
def test_albert_parity_sees_a_wrong_decay_mask(albert_run):
  """Weight decay on LayerNorms and biases too, on the reference side,
  breaks the comparison."""
  r = albert_run
  with torch_reference.one_thread():
    theirs, _ = albert_reference(r["model_dir"], r["batch_path"],
                                 dict(r["hp"], decay_all=True))
  assert_perturbed_reference_breaks(r["losses"], theirs)


# =============================================================================
# DistilBERT: student trained against a frozen teacher.
# =============================================================================
def distil_reference(student_dir, teacher_dir, batch_path, hp, *,
                     temperature, alpha_ce, alpha_mlm, alpha_cos):
  """distiller.py's loss (restrict_ce_to_mask) + alpha_ce T^2 x the
  teacher's entropy at T (a constant), per step."""
  torch.manual_seed(0)
  student = load(transformers.DistilBertForMaskedLM, student_dir,
                 dropout=0.0, attention_dropout=0.0)
  teacher = load(transformers.BertForMaskedLM, teacher_dir,
                 hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  student.train()
  teacher.eval()
  opt = TorchOptimizer(student.named_parameters(), **hp)
  t = temperature
  kl_fct = torch.nn.KLDivLoss(reduction="batchmean")
  lm_fct = torch.nn.CrossEntropyLoss(ignore_index=-100)
  cos_fct = torch.nn.CosineEmbeddingLoss(reduction="mean")
  losses = []
  for batch in load_arrays(batch_path):
    b = tensors(batch)
    ids, attn = b["input_ids"].long(), b["input_mask"].long()
    lm_labels = mlm_labels(b)
    s = student(input_ids=ids, attention_mask=attn, output_hidden_states=True)
    with torch.no_grad():
      tout = teacher(input_ids=ids, attention_mask=attn,
                     token_type_ids=b["segment_ids"].long(),
                     output_hidden_states=True)
    s_logits, t_logits = s.logits, tout.logits
    v = s_logits.size(-1)
    sel = (lm_labels > -1).unsqueeze(-1).expand_as(s_logits)
    s_sel = torch.masked_select(s_logits, sel).view(-1, v)
    t_sel = torch.masked_select(t_logits, sel).view(-1, v)
    p_t = torch.softmax(t_sel / t, dim=-1)
    loss_ce = kl_fct(torch.log_softmax(s_sel / t, dim=-1), p_t) * t ** 2
    entropy = -(p_t * torch.log_softmax(t_sel / t, dim=-1)).sum(-1).mean()
    loss_mlm = lm_fct(s_logits.view(-1, v), lm_labels.view(-1))
    s_h, t_h = s.hidden_states[-1], tout.hidden_states[-1]
    hsel = attn.bool().unsqueeze(-1).expand_as(s_h)
    dim = s_h.size(-1)
    s_hs = torch.masked_select(s_h, hsel).view(-1, dim)
    t_hs = torch.masked_select(t_h, hsel).view(-1, dim)
    loss_cos = cos_fct(s_hs, t_hs, s_hs.new_ones(s_hs.size(0)))
    loss = alpha_ce * loss_ce + alpha_mlm * loss_mlm + alpha_cos * loss_cos
    opt.step(loss)
    losses.append(float(loss.detach()) + alpha_ce * t ** 2 * float(entropy))
  return np.array(losses), opt.numel()


@pytest.fixture(scope="module")
def distil_run(tmp_path_factory):
  from bert_jax import export
  from tests.helpers import tiny_models
  base = str(tmp_path_factory.mktemp("distil_parity"))
  hf = tiny_models.make_hf_dir(os.path.join(base, "teacher"))
  config = hf["config"]
  config.objective.update(name="distil", teacher=hf["out"], student_layers=1,
                          temperature=2.0, alpha_ce=5.0, alpha_mlm=2.0,
                          alpha_cos=1.0)
  config.model.update(hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
  config.data.update(objective="packed", nsp=False, seq_length=SEQ,
                     max_predictions_per_seq=PREDS)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  config.train.update(TRAIN)
  batches = masked_batches(NUM_STEPS, config.model.vocab_size, seed=1,
                           two_segments=False)
  init, losses, norms, _ = our_run(config, batches)
  student_dir = os.path.join(base, "student_hf")
  export.write_hf_models(student_dir, init["params"], config)
  batch_path = os.path.join(base, "batches.npz")
  save_arrays(batch_path, batches)
  o = config.objective
  return dict(hp=hparams(config), losses=losses, norms=norms,
              size=count(init["params"]), student_dir=student_dir,
              teacher_dir=hf["out"], batch_path=batch_path,
              loss_kw=dict(temperature=o.temperature, alpha_ce=o.alpha_ce,
                           alpha_mlm=o.alpha_mlm, alpha_cos=o.alpha_cos))


@pytest.mark.slow
def test_distil_per_step_loss_equals_pytorch(distil_run):
  r = distil_run
  with torch_reference.one_thread():
    theirs, numel = distil_reference(r["student_dir"], r["teacher_dir"],
                                     r["batch_path"], r["hp"],
                                     **r["loss_kw"])
  assert numel == r["size"]  # The student only.
  compare("distil", r["losses"], theirs, r["norms"], r["hp"])


@pytest.mark.slow
def test_distil_parity_sees_a_wrong_loss_weight(distil_run):
  """alpha_cos 0.9 instead of 1.0 on the reference side breaks it."""
  r = distil_run
  with torch_reference.one_thread():
    theirs, _ = distil_reference(r["student_dir"], r["teacher_dir"],
                                 r["batch_path"], r["hp"],
                                 **dict(r["loss_kw"], alpha_cos=0.9))
  assert_perturbed_reference_breaks(r["losses"], theirs)


# =============================================================================
# ELECTRA: generator MLM + 50 x replaced-token detection, shared embeddings.
# =============================================================================
def electra_reference(pair_dir, batch_path, noise_path, hp, *, temperature,
                      gen_weight, disc_weight, pad_row_trains=True):
  """Per-step losses (total, generator MLM, discriminator BCE) and
  replaced-token counts of the torch pair."""
  torch.manual_seed(0)
  drop = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  gen = load(transformers.ElectraForMaskedLM,
             os.path.join(pair_dir, "generator"), **drop)
  disc = load(transformers.ElectraForPreTraining,
              os.path.join(pair_dir, "discriminator"), **drop)
  # One embeddings module (word, position, segment tables, LayerNorm) for
  # both networks; the generator decodes with its word table.
  gen.electra.embeddings = disc.electra.embeddings
  gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
  # The generator samples from the whole vocabulary, [PAD] included, and a
  # sampled [PAD] is a real token of the discriminator's input. Google's
  # ELECTRA (TF) and ours update its embedding row like any other; torch's
  # nn.Embedding(padding_idx=pad) would drop that lookup's gradient.
  if pad_row_trains:
    disc.electra.embeddings.word_embeddings.padding_idx = None
  gen.train()
  disc.train()
  opt = TorchOptimizer(list(disc.named_parameters())
                       + list(gen.named_parameters()), **hp)
  bce = torch.nn.BCEWithLogitsLoss(reduction="none")
  out = dict(loss=[], mlm=[], disc=[], replaced=[])
  for batch, noise in zip(load_arrays(batch_path), load_arrays(noise_path)):
    b = tensors(batch)
    attn, seg = b["input_mask"].long(), b["segment_ids"].long()
    pos, w = b["masked_lm_positions"].long(), b["masked_lm_weights"]
    logits = gen(input_ids=b["input_ids"].long(), attention_mask=attn,
                 token_type_ids=seg).logits
    at_pos = torch.gather(logits, 1,
                          pos[..., None].expand(-1, -1, logits.size(-1)))
    nll = torch.nn.functional.cross_entropy(
        at_pos.transpose(1, 2), b["masked_lm_ids"].long(), reduction="none")
    mlm = (nll * w).sum() / w.sum().clamp(min=1.0)
    samples = torch.argmax(at_pos.detach() / temperature
                           + torch.from_numpy(noise["noise"]), dim=-1)
    original = b["input_ids"].long().clone()
    corrupted = original.clone()
    rows, slots = torch.nonzero(w > 0, as_tuple=True)
    cols = pos[rows, slots]
    original[rows, cols] = b["masked_lm_ids"][rows, slots].long()
    corrupted[rows, cols] = samples[rows, slots]
    labels = (corrupted != original).float()
    d_logits = disc(input_ids=corrupted, attention_mask=attn,
                    token_type_ids=seg).logits
    real = attn.float()
    disc_loss = (bce(d_logits, labels) * real).sum() / real.sum()
    out["loss"].append(opt.step(gen_weight * mlm + disc_weight * disc_loss))
    out["mlm"].append(float(mlm.detach()))
    out["disc"].append(float(disc_loss.detach()))
    out["replaced"].append(float((labels * real).sum()))
  return {k: np.array(v) for k, v in out.items()}, opt.numel()


@pytest.fixture(scope="module")
def electra_run(tmp_path_factory):
  from bert_jax import config_lib
  from bert_jax import export
  from bert_jax.objectives import electra
  base = str(tmp_path_factory.mktemp("electra_parity"))
  config = config_lib.get_config("tiny")
  config.objective.name = "electra"
  config.model.update(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128,
                      max_position_embeddings=64, embedding_size=32,
                      hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
  config.data.update(seq_length=SEQ, max_predictions_per_seq=PREDS, nsp=False)
  config.mesh.update(data=1, fsdp=1, tensor=1)
  config.train.update(TRAIN)
  # ELECTRA's masking: 85% [MASK], 15% unchanged, no random tokens.
  batches = masked_batches(NUM_STEPS, config.model.vocab_size, seed=2,
                           two_segments=True, mask_share=0.85,
                           random_share=0.0)
  init, losses, norms, traced = our_run(
      config, batches, trace=("replaced_share", "mlm_loss", "disc_loss"))
  # The noise of each step: the train step's key is fold_in(rng, step).
  root = jax.random.wrap_key_data(init["rng"])
  shape = (BATCH, PREDS, config.model.vocab_size)
  noises = [dict(noise=np.asarray(electra.sampling_noise(
      jax.random.fold_in(root, step), shape))) for step in range(NUM_STEPS)]
  pair_dir = os.path.join(base, "init_hf")
  export.write_hf_models(pair_dir, init["params"], config)
  batch_path = os.path.join(base, "batches.npz")
  noise_path = os.path.join(base, "noise.npz")
  save_arrays(batch_path, batches)
  save_arrays(noise_path, noises)
  real = np.array([b["input_mask"].sum() for b in batches], np.float64)
  o = config.objective
  return dict(hp=hparams(config), losses=losses, norms=norms,
              mlm=traced["mlm_loss"], disc=traced["disc_loss"],
              replaced=np.round(traced["replaced_share"] * real),
              size=count(init["params"]), pair_dir=pair_dir,
              batch_path=batch_path, noise_path=noise_path,
              loss_kw=dict(temperature=o.generator_temperature,
                           gen_weight=o.gen_weight,
                           disc_weight=o.disc_weight))


def test_electra_sampling_noise_is_jax_categorical():
  """argmax(logits / T + sampling_noise) is jax.random.categorical's draw,
  and the noise is the one loss_sums' sampling key gives."""
  from bert_jax.objectives import electra
  rng = jax.random.key(7)
  logits = 3.0 * jax.random.normal(jax.random.key(1), (4, PREDS, 50))
  noise = electra.sampling_noise(rng, logits.shape)
  want = jax.random.categorical(electra.step_keys(rng)[0], logits / 1.5)
  np.testing.assert_array_equal(np.argmax(logits / 1.5 + noise, -1), want)


@pytest.mark.slow
def test_electra_per_step_loss_equals_pytorch(electra_run):
  r = electra_run
  with torch_reference.one_thread():
    theirs, numel = electra_reference(
        r["pair_dir"], r["batch_path"], r["noise_path"], r["hp"],
        **r["loss_kw"])
  assert numel == r["size"]  # Shared embeddings counted once.
  # The same tokens were replaced in both (the generator's samples agree).
  np.testing.assert_array_equal(theirs["replaced"], r["replaced"])
  compare("electra", r["losses"], theirs["loss"], r["norms"], r["hp"])
  # Each network on its own: 50 x BCE dominates the total, which would hide
  # a generator that trains differently.
  for part in ("mlm", "disc"):
    rel = max_rel(r[part], theirs[part])
    print(f"electra {part}: max relative difference {rel:.3g}")
    assert rel < TOLERANCE, (part, rel)


@pytest.mark.slow
def test_electra_parity_sees_the_pad_row(electra_run):
  """With torch's padding_idx kept, a [PAD] sampled by the generator
  (once in these 20 steps) gives no gradient to its embedding row there,
  and the generator's loss drifts past the tolerance."""
  r = electra_run
  with torch_reference.one_thread():
    theirs, _ = electra_reference(
        r["pair_dir"], r["batch_path"], r["noise_path"], r["hp"],
        **dict(r["loss_kw"], pad_row_trains=False))
  rel = max_rel(r["mlm"], theirs["mlm"])
  print(f"padding_idx kept: generator loss max relative difference {rel:.3g}")
  assert rel > TOLERANCE


# =============================================================================
# ModernBERT: masked LM on rows longer than its sliding window.
# =============================================================================
def modernbert_reference(model_dir, batch_path, hp, attn="sdpa", **config):
  """ModernBertForMaskedLM with its own loss (`labels` with -100 off the
  masked positions: the mean over them, our MLM sum / masked count when
  positions are distinct and weights 0/1)."""
  torch.manual_seed(0)
  model = transformers.ModernBertForMaskedLM.from_pretrained(
      model_dir, attn_implementation=attn, dtype=torch.float32,
      embedding_dropout=0.0, mlp_dropout=0.0, attention_dropout=0.0,
      **config)
  return train_with_own_loss(model, batch_path, hp)


@pytest.fixture(scope="module")
def modernbert_run(tmp_path_factory):
  from tests.helpers import family_checks
  base = str(tmp_path_factory.mktemp("modernbert_parity"))
  config = family_checks.family_config("modernbert")  # 8-token window.
  config.data.update(max_predictions_per_seq=PREDS, seq_length=SEQ)
  return run_and_export(base, config, seed=3, two_segments=False,
                        table=modernbert_family.MODERNBERT)


@pytest.mark.slow
def test_modernbert_per_step_loss_equals_pytorch(modernbert_run):
  r = modernbert_run
  with torch_reference.one_thread():
    theirs, numel = modernbert_reference(r["model_dir"], r["batch_path"],
                                         r["hp"])
  assert numel == r["size"]  # The decoder weight is the embedding, once.
  compare("modernbert", r["losses"], theirs, r["norms"], r["hp"])


@pytest.mark.slow
def test_modernbert_parity_sees_a_wider_window(modernbert_run):
  """The reference with local_attention 10 instead of 8 (one more key on
  each side of every sliding-window query) breaks the comparison."""
  r = modernbert_run
  with torch_reference.one_thread():
    theirs, _ = modernbert_reference(r["model_dir"], r["batch_path"],
                                     r["hp"], local_attention=10)
  assert_perturbed_reference_breaks(r["losses"], theirs)


# =============================================================================
# RoBERTa: masked LM alone, positions counted from the padding id.
# =============================================================================
def roberta_reference(model_dir, batch_path, hp, **config):
  """RobertaForMaskedLM with its own loss (`labels` with -100 off the masked
  positions); its positions come from input_ids != pad_token_id."""
  torch.manual_seed(0)
  model = load(transformers.RobertaForMaskedLM, model_dir,
               hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               **config)
  return train_with_own_loss(model, batch_path, hp)


@pytest.fixture(scope="module")
def roberta_run(tmp_path_factory):
  from bert_jax.families import roberta as roberta_family
  from tests.helpers import family_checks
  base = str(tmp_path_factory.mktemp("roberta_parity"))
  config = family_checks.family_config("roberta")  # Padding id 0.
  config.data.update(max_predictions_per_seq=PREDS, seq_length=SEQ)
  return run_and_export(base, config, seed=4, two_segments=False,
                        table=roberta_family.FAMILY.pretraining_tables[0])


def test_roberta_per_step_loss_equals_pytorch(roberta_run):
  r = roberta_run
  with torch_reference.one_thread():
    theirs, numel = roberta_reference(r["model_dir"], r["batch_path"],
                                      r["hp"])
  assert numel == r["size"]  # The decoder is the embedding, once.
  compare("roberta", r["losses"], theirs, r["norms"], r["hp"])


def test_roberta_parity_sees_positions_from_another_padding_id(roberta_run):
  """The reference counting positions from padding id 3 instead of 0 (every
  position two further into the table) breaks the comparison."""
  r = roberta_run
  with torch_reference.one_thread():
    theirs, _ = roberta_reference(r["model_dir"], r["batch_path"], r["hp"],
                                  pad_token_id=3)
  assert_perturbed_reference_breaks(r["losses"], theirs)
