"""Analytic training FLOPs (models/flops.py, checked against XLA's count
of the compiled step), peaks and MFU (training/utilization.py)."""

import collections

import jax
import pytest

from bert_jax import config_lib
from bert_jax import compose
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from bert_jax.training import utilization


def _xla_config(family: str, seq_length: int = 64,
                max_predictions: int = 10):
  """A small config of `family` whose matmuls dominate the step."""
  config = config_lib.get_config("tiny")
  config.model.update(vocab_size=512, hidden_size=256, num_attention_heads=4,
                      intermediate_size=1024, num_hidden_layers=2,
                      max_position_embeddings=max(64, seq_length))
  config.data.seq_length = seq_length
  config.data.max_predictions_per_seq = max_predictions
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
  """XLA's FLOP count of the compiled train step (loss, gradient, update)."""
  programs = steps_lib.Programs(config, sharding.make_mesh(config.mesh))
  with programs.context():
    compiled = programs.train_step.lower(
        programs.abstract_state,
        programs.batch_spec(config.train.batch_size)).compile()
  return compiled.cost_analysis()["flops"]


# A vocabulary of 8,192 at 16 of 64 positions: the MLM head is a quarter of
# BERT's step. ALBERT factorized (E=192 < d=256) with a small FFN: the
# E -> d projection is 6% of the step, the d -> E head 46%; its unshared
# variant (two groups) counts the same FLOPs per layer.
HEAD_HEAVY = dict(vocab_size=8192)
ALBERT_FACTORIZED = dict(vocab_size=8192, embedding_size=192,
                         intermediate_size=256, num_hidden_layers=1)


@pytest.mark.slow
@pytest.mark.parametrize("family, seq_length, max_predictions, model", [
    ("bert", 64, 10, {}), ("bert", 256, 40, {}),
    ("bert", 64, 16, HEAD_HEAVY), ("albert", 64, 10, {}),
    ("albert", 64, 16, ALBERT_FACTORIZED),
    ("albert", 64, 16, dict(ALBERT_FACTORIZED, num_hidden_layers=2,
                            num_hidden_groups=2)),
    ("distil", 64, 10, {})])
def test_analytic_count_matches_xla_cost_analysis(family, seq_length,
                                                  max_predictions, model):
  """The objective's formula counts the matmuls, so XLA's count of the
  compiled step is at least it and at most 8% more (elementwise ops,
  embeddings, the optimizer). At 256 tokens attention's 12 L T d is 17% of
  BERT's step: a formula without it, or with T fixed at 64, fails here.
  With the head-heavy vocabulary, a count without the MLM head, or with
  logits at all T positions instead of the P gathered ones, fails; so does
  ALBERT's without the E -> d projection or with a d -> d head. DistilBERT's
  includes the frozen teacher's forward pass only (XLA computes no teacher
  gradient under stop_gradient): without the teacher, or with its training
  count, it fails."""
  config = _xla_config(family, seq_length, max_predictions)
  config.model.update(model)
  ratio = _xla_flops(config) / compose.train_flops_per_step(config)
  assert 1.0 <= ratio <= 1.08, ratio


@pytest.mark.slow
def test_modernbert_sliding_window_count_matches_xla_cost_analysis():
  """512 tokens, a 32-token window: attention dominates, and the two
  sliding-window layers' blocked path computes 48 keys per query, not 512.
  Our count is within 5% of XLA's (counting 512 there would be 24% over)."""
  config = _xla_config("modernbert")
  assert _xla_flops(config) == pytest.approx(
      compose.train_flops_per_step(config), rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["token_classify", "span_qa",
                                       "classify"])
def test_modernbert_per_token_heads_count_matches_xla_cost_analysis(
    objective):
  """ModernBERT's token and QA heads: the encoder as pretraining's (no MLM
  logits) plus the prediction head (d -> d) and classifier on every token.
  XLA counts at least that and at most 8% more (1.051 here; the MLM step
  of this config 1.048); leaving out the head's dense on every token would
  be 1.09. The sequence classifier: the encoder alone (its head runs on
  one pooled vector per row); BERT's count for it would miss GeGLU's third
  matrix and the window."""
  config = _xla_config("modernbert")
  config.objective.update(name=objective, encoder="modernbert")
  config.model.num_labels = 5
  ratio = _xla_flops(config) / compose.train_flops_per_step(config)
  assert 1.0 <= ratio <= 1.08, ratio


# Names that contain one another, with a different value in every cell.
FAKE_PEAKS = {"chip": (10.0, 1.0), "chip x": (20.0, 2.0),
              "chip x lite": (30.0, 3.0)}
Device = collections.namedtuple("Device", "device_kind")


@pytest.mark.parametrize("order", ["shortest first", "longest first"])
def test_peak_lookup_picks_the_longest_matching_name(monkeypatch, order):
  """Device kinds name their chip inside a longer string, in any case; of
  the table's names it contains, the longest wins, whatever the order."""
  items = list(FAKE_PEAKS.items())
  monkeypatch.setattr(utilization, "KNOWN_PEAKS", dict(
      items if order == "shortest first" else items[::-1]))
  look = lambda kind: utilization.known_peak_tflops(kind, "bfloat16")
  assert look("Vendor CHIP X Lite 16GB") == 30.0
  assert look("vendor chip x") == 20.0
  assert look("Chip") == 10.0
  assert look("another accelerator") is None


def test_tpu_lite_kinds_are_not_read_as_their_pod_chips():
  """v5e reports "TPU v5 lite", which also contains "tpu v5" (v5p's
  number); v6e reports "TPU v6 lite"."""
  known = utilization.known_peak_tflops
  peaks = utilization.KNOWN_PEAKS
  assert known("TPU v5 lite", "bfloat16") == peaks["tpu v5e"][0]
  assert peaks["tpu v5e"][0] != peaks["tpu v5p"][0] == peaks["tpu v5"][0]
  assert known("TPU v5p", "bfloat16") == peaks["tpu v5p"][0]
  assert known("TPU v6 lite", "bfloat16") == peaks["tpu v6e"][0]


@pytest.mark.parametrize("dtype, column", [("bfloat16", 0), ("float16", 0),
                                           ("float32", 1)])
def test_peak_column_follows_the_compute_dtype(monkeypatch, dtype, column):
  """16-bit compute reads the bf16 column, float32 the fp32 one (TF32 on
  GPUs: half of bf16 on an A100)."""
  monkeypatch.setattr(utilization, "KNOWN_PEAKS", FAKE_PEAKS)
  assert utilization.known_peak_tflops("chip x", dtype) == (
      FAKE_PEAKS["chip x"][column])


def test_unknown_device_kind_falls_back_to_measuring(monkeypatch):
  measured = []
  monkeypatch.setattr(utilization, "measure_matmul_tflops",
                      lambda dtype: measured.append(dtype) or 7.0)
  assert utilization.peak_tflops(
      "bfloat16", device=Device("Some Future Accelerator")) == (
          7.0, "measured 2048^3 matmul")
  v5e = utilization.KNOWN_PEAKS["tpu v5e"][0]
  assert utilization.peak_tflops("bfloat16", device=Device("TPU v5 lite")) == (
      v5e, "spec sheet (TPU v5 lite)")
  assert measured == ["bfloat16"]  # The known kind measured nothing.


@pytest.mark.slow
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
