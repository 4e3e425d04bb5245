"""DistilBERT (Sanh et al. 2019): a smaller student trained to mimic a BERT.

``config.model`` is the TEACHER's architecture (a BERT this project loads:
a pretraining workdir, an imported or a Hugging Face directory, named by
``objective.teacher``). The student is the same BERT with
``objective.student_layers`` layers, no segment embeddings and no pooler
(``model.BertForMaskedLM`` with type_vocab_size 0: DistilBERT's layout),
initialized from the teacher's embeddings, MLM head and evenly spaced layers
(12 -> 6 takes 0, 2, 4, 7, 9, 11, as the reference's extract_distilbert.py).

The teacher lives in the train state as ``state["frozen"]`` (sharded by the
same logical rules, no gradient, no optimizer state) and runs inside the same
jitted step. Loss, as the reference distiller.py with the published weights:
  alpha_ce  * T^2 * soft-target cross-entropy(student/T, teacher/T) on the
              masked positions (KL up to the teacher's entropy: same gradient)
+ alpha_mlm * masked-LM cross-entropy on the true tokens
+ alpha_cos * (1 - cos(student, teacher last hidden state)) on real tokens.
``objective.teacher="random"`` uses a randomly initialized teacher (tests,
smoke runs only). The trainer loads the teacher (``Objective.teacher``:
``training/start_from.py`` checks it is a BERT of config.model's
architecture at startup).
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bert_jax.data import checks as data_checks
from bert_jax.data import features
from bert_jax.models import bert as bert_model
from bert_jax.models import flops as flops_lib
from bert_jax.objectives import Objective
from bert_jax.objectives import Teacher
from bert_jax.objectives import bert
from bert_jax.objectives import check_packed_input
from bert_jax.objectives import safe_div

RANDOM_TEACHER = "random"


def student_config(config) -> ml_collections.ConfigDict:
  """The student's model group: the teacher's with fewer layers, no segment
  table (DistilBERT's architecture; families/distilbert.py exports it)."""
  mc = config.model.copy_and_resolve_references()
  mc.num_hidden_layers = int(config.objective.student_layers)
  mc.type_vocab_size = 0
  return mc


def student_layer_map(teacher_layers: int, student_layers: int) -> list[int]:
  """Teacher layer copied into each student layer: evenly spaced, first and
  last included (12 -> 6: [0, 2, 4, 7, 9, 11])."""
  return [int(round(x)) for x in np.linspace(0, teacher_layers - 1,
                                             student_layers)]


def make_model(config, rngs):
  return bert_model.BertForMaskedLM(student_config(config), rngs=rngs)


def make_teacher(config, rngs):
  return bert_model.BertForPreTraining(config.model, rngs=rngs)


def feature_spec(config):
  del config
  return features.PRETRAINING


def student_from_teacher(config, teacher: dict) -> dict:
  """Student params copied from a BertForPreTraining param tree."""
  t_bert = teacher["bert"]
  emb = {k: v for k, v in t_bert["embeddings"].items()
         if k != "token_type_embeddings"}
  layers = {i: t_bert["layers"][j] for i, j in enumerate(student_layer_map(
      int(config.model.num_hidden_layers),
      int(config.objective.student_layers)))}
  return {"bert": {"embeddings": emb, "layers": layers},
          "mlm_head": teacher["mlm_head"]}


def distill_sums(s_logits, t_logits, weights, temperature: float) -> dict:
  """Sums over weighted masked positions of the soft-target cross-entropy
  (x T^2), and of the KL(teacher || student) at temperature 1."""
  s32, t32 = s_logits.astype(jnp.float32), t_logits.astype(jnp.float32)
  logp_s = jax.nn.log_softmax(s32 / temperature, axis=-1)
  p_t = jax.nn.softmax(t32 / temperature, axis=-1)
  ce = -jnp.sum(p_t * logp_s, axis=-1) * temperature ** 2
  logp_s1, logp_t1 = jax.nn.log_softmax(s32, -1), jax.nn.log_softmax(t32, -1)
  kl = jnp.sum(jnp.exp(logp_t1) * (logp_t1 - logp_s1), axis=-1)
  return dict(distill_ce=jnp.sum(ce * weights), teacher_kl=jnp.sum(kl * weights))


def cosine_sums(s_seq, t_seq, input_mask) -> dict:
  """Sum over real tokens of 1 - cos(student, teacher) last hidden states."""
  s32, t32 = s_seq.astype(jnp.float32), t_seq.astype(jnp.float32)
  eps = 1e-8  # torch.nn.CosineEmbeddingLoss's.
  cos = jnp.sum(s32 * t32, -1) / jnp.sqrt(
      jnp.sum(s32 * s32, -1) * jnp.sum(t32 * t32, -1) + eps)
  m = input_mask.astype(jnp.float32)
  return dict(cos_loss=jnp.sum((1.0 - cos) * m), token_count=jnp.sum(m))


def loss_sums(model, batch, rng, deterministic: bool, config, *,
              frozen) -> dict:
  s = bert.forward(model, batch, rng, deterministic)
  t = frozen(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
             batch["masked_lm_positions"], deterministic=True)
  t_logits = jax.lax.stop_gradient(t["mlm_logits"])
  t_seq = jax.lax.stop_gradient(t["sequence_output"])
  return {**bert.mlm_sums(s["mlm_logits"], batch),
          **distill_sums(s["mlm_logits"], t_logits,
                         batch["masked_lm_weights"],
                         float(config.objective.temperature)),
          **cosine_sums(s["sequence_output"], t_seq, batch["input_mask"])}


def counts(batch, config) -> dict:
  del config
  return dict(mlm_weight=jnp.sum(batch["masked_lm_weights"]),
              token_count=jnp.sum(batch["input_mask"].astype(jnp.float32)))


def _means(sums, counts_) -> dict:
  n = counts_["mlm_weight"]
  return dict(distill_ce=safe_div(sums["distill_ce"], n),
              mlm_loss=safe_div(sums["mlm_loss"], n),
              cos_loss=safe_div(sums["cos_loss"], counts_["token_count"]),
              teacher_kl=safe_div(sums["teacher_kl"], n),
              mlm_accuracy=safe_div(sums["mlm_correct"], n))


def loss(sums, counts_, config):
  o, m = config.objective, _means(sums, counts_)
  return (o.alpha_ce * m["distill_ce"] + o.alpha_mlm * m["mlm_loss"]
          + o.alpha_cos * m["cos_loss"])


def metrics(sums, counts_, config) -> dict:
  return dict(_means(sums, counts_), loss=loss(sums, counts_, config))


def validate(config) -> None:
  o = config.objective
  if not o.teacher:
    raise ValueError("objective.teacher is empty: set it to the teacher BERT "
                     "(a workdir, an imported or a Hugging Face directory) "
                     "or to 'random' for a smoke run.")
  if (o.teacher != "random" and "://" not in o.teacher and
      not os.path.exists(o.teacher)):
    raise ValueError(f"objective.teacher: {o.teacher!r} does not exist: set "
                     "it to the teacher BERT (a workdir, an imported or a "
                     "Hugging Face directory) or to 'random' for a smoke "
                     "run.")
  check_packed_input(config, "DistilBERT")
  if not 1 <= o.student_layers <= config.model.num_hidden_layers:
    raise ValueError(f"objective.student_layers={o.student_layers} must be in "
                     f"[1, model.num_hidden_layers="
                     f"{config.model.num_hidden_layers}] (the teacher's).")
  if o.temperature <= 0 or min(o.alpha_ce, o.alpha_mlm, o.alpha_cos) < 0:
    raise ValueError(f"objective.temperature={o.temperature} must be > 0 and "
                     "objective.alpha_ce/alpha_mlm/alpha_cos >= 0.")
  data_checks.check_pretraining(config)


def flops(config, work) -> float:
  """The student's training (encoder on every token, MLM head at the masked
  positions) plus the frozen teacher's forward pass only: its encoder on
  every token and its MLM logits at the same positions (the soft targets).
  The teacher's own pretraining is not counted."""
  return (flops_lib.masked_lm_flops(student_config(config), work)
          + flops_lib.forward_flops(flops_lib.masked_lm_flops(config.model,
                                                              work)))


def teacher_path(config) -> str:
  """objective.teacher, or "" for a randomly initialized teacher."""
  teacher = config.objective.teacher
  return "" if teacher == RANDOM_TEACHER else teacher


OBJECTIVE = Objective(
    name="distil", make_model=make_model, feature_spec=feature_spec,
    loss_sums=loss_sums, counts=counts, loss=loss, metrics=metrics,
    log_keys=(("loss", "loss"), ("mlm_acc", "mlm_accuracy"),
              ("ce", "distill_ce"), ("kl", "teacher_kl"), ("cos", "cos_loss")),
    flops=flops, validate=validate,
    teacher=Teacher(field="objective.teacher", path=teacher_path,
                    make_model=make_teacher, family="bert",
                    init_student=student_from_teacher))
