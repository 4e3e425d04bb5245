"""Analytic training FLOPs, peaks and MFU (bert_jax/flops.py)."""

import jax
import pytest

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.models import flops as flops_lib
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from bert_jax.training import utilization


def test_bert_base_flops_follow_the_formula():
  m = config_lib.model_config("base")  # 12 x 768, d_ff 3072, vocab 30522.
  enc = 6 * 12 * (4 * 768**2 + 2 * 768 * 3072) + 12 * 12 * 128 * 768
  head = 6 * (768**2 + 768 * 30522)
  assert flops_lib.encoder_flops_per_token(m, 128) == enc == 523_763_712
  assert flops_lib.mlm_head_flops_per_position(m) == head == 144_184_320
  # 20 predicted positions per 128-token sequence.
  assert flops_lib.train_flops_per_token(m, 128, 20) == pytest.approx(
      enc + 20 * head / 128)
  # Logits at every position (HF) cost ~21% more for the same step here.
  full = flops_lib.train_flops_per_sequence(m, 128, 128)
  assert full / flops_lib.train_flops_per_sequence(m, 128, 20) > 1.2


def _xla_config(family: str):
  """A small config of `family` whose matmuls dominate the step."""
  config = config_lib.get_config("tiny")
  config.model.update(vocab_size=512, hidden_size=256, num_attention_heads=4,
                      intermediate_size=1024, num_hidden_layers=2,
                      max_position_embeddings=64)
  config.data.seq_length, config.data.max_predictions_per_seq = 64, 10
  config.train.batch_size = 8
  config.objective.name = family
  if family == "albert":
    config.model.embedding_size = 64
    config.data.update(objective="sop", max_ngram=3)
  elif family == "distil":
    config.model.num_hidden_layers = 4
    config.objective.update(teacher="random", student_layers=2)
    config.data.update(objective="packed", nsp=False)
  elif family == "modernbert":  # A global and two blocked window layers.
    config.model.update(num_hidden_layers=3, type_vocab_size=0,
                        num_attention_heads=2, intermediate_size=256,
                        local_attention=32, max_position_embeddings=512,
                        layer_norm_eps=1e-5)
    config.data.update(objective="packed", nsp=False, seq_length=512,
                       max_predictions_per_seq=20)
    config.train.batch_size = 2
  return config


def _xla_flops(config) -> float:
  """XLA's FLOP count of the lowered train step (loss, gradient, update)."""
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  with programs.context():
    lowered = programs.train_step.lower(
        programs.abstract_state,
        programs.batch_spec(config.train.batch_size))
  return lowered.cost_analysis()["flops"]


@pytest.mark.parametrize("family", ["bert", "albert", "distil"])
def test_analytic_count_matches_xla_cost_analysis(family):
  """The compiled step's own FLOP count agrees with the objective's formula
  within 5% (the formula leaves out elementwise ops, embeddings and the
  optimizer). DistilBERT's includes the frozen teacher's forward pass only
  (XLA computes no teacher gradient under stop_gradient)."""
  config = _xla_config(family)
  assert _xla_flops(config) == pytest.approx(
      objectives.train_flops_per_step(config), rel=0.05)


def test_modernbert_sliding_window_count_matches_xla_cost_analysis():
  """512 tokens, a 32-token window: attention dominates, and the two
  sliding-window layers' blocked path computes 48 keys per query, not 512.
  Our count is within 5% of XLA's (counting 512 there would be 24% over)."""
  config = _xla_config("modernbert")
  assert _xla_flops(config) == pytest.approx(
      objectives.train_flops_per_step(config), rel=0.05)


def test_family_counts_by_hand():
  """ALBERT: BERT's count with the E -> H projection and the H -> E head
  (sharing saves no FLOPs); DistilBERT: student training + teacher forward
  (1/3 of its training count) at the same masked positions."""
  t, p, v, b = 64, 10, 512, 8
  enc = lambda layers, d, f: (6 * layers * (4 * d * d + 2 * d * f)
                              + 12 * layers * t * d)
  albert = _xla_config("albert")
  per_seq = (t * (enc(2, 256, 1024) + 6 * 64 * 256)
             + p * 6 * (256 * 64 + 64 * v))
  assert objectives.train_flops_per_step(albert) == b * per_seq
  albert.model.num_hidden_groups = 2  # Unshared: the same FLOPs.
  assert objectives.train_flops_per_step(albert) == b * per_seq
  distil = _xla_config("distil")
  head = 6 * (256 * 256 + 256 * v)
  student = t * enc(2, 256, 1024) + p * head
  teacher = t * enc(4, 256, 1024) + p * head
  assert objectives.train_flops_per_step(distil) == pytest.approx(
      b * (student + teacher / 3))


@pytest.mark.parametrize("kind, dtype, peak", [
    ("TPU v4", "bfloat16", 275.0),
    ("TPU v5 lite", "bfloat16", 197.0),
    ("TPU v5p", "float32", 459.0),
    ("TPU v6 lite", "bfloat16", 918.0),
    ("NVIDIA A100-SXM4-80GB", "bfloat16", 312.0),
    ("NVIDIA H100 80GB HBM3", "bfloat16", 989.0),
    ("NVIDIA H200", "float32", 494.0),
    ("cpu", "bfloat16", None),
])
def test_known_peaks(kind, dtype, peak):
  assert utilization.known_peak_tflops(kind, dtype) == peak


def test_peak_configured_wins_and_cpu_is_measured():
  assert utilization.peak_tflops("bfloat16", configured=123.0) == (123.0,
                                                              "configured")
  if jax.default_backend() == "cpu":
    peak, source = utilization.peak_tflops("float32")
    assert source.startswith("measured") and 0 < peak < 100
    # Cached: the second call does not measure again.
    assert utilization.peak_tflops("float32")[0] == peak


def test_mfu():
  tflops, mfu = utilization.mfu(flops_per_step=8e12, step_seconds=2.0,
                          num_devices=4, peak=2.0)
  assert tflops == pytest.approx(1.0) and mfu == pytest.approx(0.5)
