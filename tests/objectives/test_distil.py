"""DistilBERT: student size vs Hugging Face, the distillation loss against
the teacher's entropy, the teacher inside the step (no gradient, no optimizer
state), export parity, fill_mask, 1-vs-8-device losses and resume."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import export
from bert_jax import pretrained
from bert_jax.downstream import mask_filling
from bert_jax.families import distilbert as distilbert_family
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files
from bert_jax.models import bert
from bert_jax.objectives import distil
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests.helpers import family_checks
from tests.helpers import synthetic_batch
from tests.helpers import tiny_models


def _load_config(name):
  return family_checks.load_config(name)


def test_student_of_base_has_hugging_face_size_and_layout():
  from transformers import DistilBertConfig
  from transformers import DistilBertForMaskedLM
  config = _load_config("distil_base")
  ours = bert.count_params(nnx.eval_shape(
      lambda: distil.make_model(config, nnx.Rngs(0))))
  hf = DistilBertForMaskedLM(DistilBertConfig(
      **distilbert_family.DISTILBERT.config_to_hf(
          distil.student_config(config))))
  assert ours == sum(p.numel() for p in hf.parameters()) == 66_985_530
  assert distil.student_layer_map(12, 6) == [0, 2, 4, 7, 9, 11]
  o = config.objective
  assert (o.temperature, o.alpha_ce, o.alpha_mlm, o.alpha_cos) == (
      2.0, 5.0, 2.0, 1.0)


def _tiny(teacher="random", student_layers=2, temperature=1.0):
  config = family_checks.family_config("distil")
  config.objective.update(teacher=teacher, student_layers=student_layers,
                          temperature=temperature)
  return config


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_student_equal_to_teacher_pays_the_teachers_entropy(temperature):
  """Student = teacher (all layers copied, segment row 0 zeroed so the
  missing segment table changes nothing): the soft-target CE per masked
  token is T^2 x the teacher's own entropy at T, KL and cosine loss are 0."""
  config = _tiny(temperature=temperature)
  teacher_module = distil.make_teacher(config, nnx.Rngs(3))
  teacher = jax.tree.map(np.array,  # Writable copies.
                         nnx.state(teacher_module, nnx.Param).to_pure_dict())
  teacher["bert"]["embeddings"]["token_type_embeddings"][0] = 0.0
  teacher["mlm_head"]["bias"] = np.random.RandomState(0).normal(
      0, 2.0, teacher["mlm_head"]["bias"].shape).astype(np.float32)
  nnx.update(teacher_module, teacher)
  student = distil.make_model(config, nnx.Rngs(4))
  nnx.update(student, distil.student_from_teacher(config, teacher))
  batch = jax.tree.map(jnp.asarray, synthetic_batch(0))
  batch["segment_ids"] = jnp.zeros_like(batch["segment_ids"])
  sums = distil.loss_sums(student, batch, None, True, config,
                          frozen=teacher_module)
  m = distil.metrics(sums, distil.counts(batch, config), config)
  logits = np.asarray(teacher_module(
      batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])["mlm_logits"], np.float64) / temperature
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
      -1, keepdims=True)) - logits.max(-1, keepdims=True)
  entropy = -(np.exp(logp) * logp).sum(-1)
  w = np.asarray(batch["masked_lm_weights"])
  want = temperature ** 2 * (entropy * w).sum() / w.sum()
  assert want > 0.5  # Not a degenerate one-hot teacher.
  np.testing.assert_allclose(float(m["distill_ce"]), want, rtol=1e-5)
  assert abs(float(m["teacher_kl"])) < 1e-5
  assert abs(float(m["cos_loss"])) < 1e-5
  np.testing.assert_allclose(
      float(m["loss"]), 5.0 * float(m["distill_ce"]) + 2.0 * float(
          m["mlm_loss"]), rtol=1e-6)


@pytest.mark.slow
def test_teacher_in_state_gets_no_gradient_and_no_optimizer_state(tmp_path):
  hf_dir = tiny_models.make_hf_dir(str(tmp_path))
  config = _tiny(teacher=hf_dir["out"], student_layers=1)
  config.model.update({k: hf_dir["config"].model[k] for k in (
      "vocab_size", "intermediate_size")})
  mesh = sharding.make_mesh(config.mesh, jax.devices()[:1])
  programs = steps_lib.Programs(config, mesh)
  with programs.context():
    state = programs.warm_start(programs.init())
    teacher = jax.device_get(state["frozen"])
    jax.tree.map(np.testing.assert_array_equal, teacher, hf_dir["params"])
    student = jax.device_get(state["params"])
    jax.tree.map(np.testing.assert_array_equal, student["bert"]["layers"][0],
                 teacher["bert"]["layers"][0])
    assert "token_type_embeddings" not in student["bert"]["embeddings"]
    n_params = len(jax.tree.leaves(state["params"]))
    # Adam: two moments per trainable leaf, none for the teacher's.
    assert len(jax.tree.leaves(state["opt_state"])) <= 2 * n_params + 4
    losses = []
    for step in range(3):
      batch = synthetic_batch(step, vocab=config.model.vocab_size)
      state, metrics = programs.train_step(
          state, sharding.global_batch(batch, programs.batch_sharding))
      losses.append(float(metrics["loss"]))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(state["frozen"]),
               teacher)
  moved = jax.device_get(state["params"])["bert"]["layers"][0]
  assert not np.array_equal(moved["attention"]["query"]["kernel"],
                            student["bert"]["layers"][0]["attention"]["query"][
                                "kernel"])
  assert losses[2] < losses[0], losses


def test_export_matches_pytorch_and_fill_mask_runs_on_it(tmp_path):
  import torch
  from transformers import DistilBertForMaskedLM
  from transformers import pipeline

  hf_dir = tiny_models.make_hf_dir(str(tmp_path / "teacher"))
  config = _tiny(teacher=hf_dir["out"], student_layers=1)
  config.model.update({k: hf_dir["config"].model[k] for k in (
      "vocab_size", "intermediate_size")})
  student = distil.student_from_teacher(config, hf_dir["params"])
  out = str(tmp_path / "student")
  export.write_hf_models(out, student, config,
                         tokenizer=tokenizer_files.TokenizerSpec(
                             "wordpiece", hf_dir["vocab_path"], True))
  module = mapping.make_model(student, distil.student_config(config),
                              distilbert_family.DISTILBERT)
  r = np.random.RandomState(0)
  ids = r.randint(5, config.model.vocab_size, (2, 12))
  mask = np.ones_like(ids)
  mask[1, 7:] = 0
  ours = np.asarray(module(jnp.asarray(ids), jnp.asarray(mask),
                           jnp.zeros_like(jnp.asarray(ids)))["mlm_logits"])
  with torch.no_grad():
    theirs = DistilBertForMaskedLM.from_pretrained(out).eval()(
        input_ids=torch.tensor(ids),
        attention_mask=torch.tensor(mask)).logits.numpy()
  np.testing.assert_allclose(ours[mask > 0], theirs[mask > 0], atol=1e-4)
  source = pretrained.resolve(out)
  back, _ = pretrained.load_params(source)
  assert source.table is distilbert_family.DISTILBERT
  jax.tree.map(np.testing.assert_array_equal, student, back)

  text = "the movie was [MASK] and the story was good ."
  got = mask_filling.fill_mask(out, text, top_k=3)
  want = pipeline("fill-mask", model=out, device="cpu")(text, top_k=3)
  assert [g["token_str"] for g in got] == [w["token_str"] for w in want]
  np.testing.assert_allclose([g["score"] for g in got],
                             [w["score"] for w in want], atol=1e-4)


@pytest.mark.slow
def test_one_vs_eight_devices_same_losses(tmp_path):
  family_checks.assert_meshes_agree("distil", tmp_path)


@pytest.mark.slow
def test_resume_continues_exactly_and_the_student_exports(tmp_path):
  """Stop-and-rerun from the step-4 checkpoint (teacher in the state, data
  position), then tools/convert_to_hf.py writes the student as
  DistilBertForMaskedLM and fill_mask runs on it."""
  from transformers import DistilBertForMaskedLM

  workdir = family_checks.assert_resume_is_exact(
      tmp_path, "distil_base.py", "--config.objective.teacher=random",
      "--config.objective.student_layers=1",
      "--config.model.num_hidden_layers=2")
  out = str(tmp_path / "hf")
  family_checks.export_workdir(workdir, out)
  hf = DistilBertForMaskedLM.from_pretrained(out)
  assert hf.config.n_layers == 1
  result = mask_filling.fill_mask(out, "the [MASK] of the function .", top_k=2)
  assert len(result) == 2
  # The workdir fills masks with its student too (its run config's model
  # group is the teacher's: the objective says which model the params are).
  from_run = mask_filling.fill_mask(workdir, "the [MASK] of the function .",
                                    top_k=2)
  assert [r["token"] for r in from_run] == [r["token"] for r in result]
  np.testing.assert_allclose([r["score"] for r in from_run],
                             [r["score"] for r in result], atol=1e-5)


@pytest.mark.parametrize("field,value,message", [
    ("teacher", "", "objective.teacher is empty"),
    ("student_layers", 9, r"student_layers=9 must be in \[1, "),
    ("temperature", 0.0, "temperature=0.0 must be > 0"),
])
def test_startup_checks_name_the_field(field, value, message):
  """objectives/distil.py's `validate` hook runs in config_checks."""
  from bert_jax.training import config_checks
  config = _tiny()
  config_checks.validate(config, 1, check_sources=False)
  config.objective[field] = value
  with pytest.raises(ValueError, match=message):
    config_checks.validate(config, 1, check_sources=False)
