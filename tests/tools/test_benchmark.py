"""tools/benchmark.py and bench_seq_lengths.py, the speed options of the
model, and compile counts."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import benchmarking
from bert_jax import compose
from bert_jax.models import bert
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib
from tests import helpers
from tests.helpers import REPO
from tests.helpers import run_tool

bench_seq_lengths = helpers.import_tool("bench_seq_lengths")


def tiny_config(**model):
  """The shared tiny config at this file's sizes (batch 8, FFN 128)."""
  return helpers.tiny_config(
      model=dict(vocab_size=256, intermediate_size=128) | model,
      train=dict(batch_size=8, warmup_steps=1, learning_rate=1e-4))


def forward_and_grad(model_config, batch, dropout=False):
  """MLM logits and the gradient of their sum w.r.t. the params (seed 0)."""
  model = bert.BertForPreTraining(model_config, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)

  def f(params):
    m = nnx.merge(graphdef, params)
    out = m(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
            batch["masked_lm_positions"], deterministic=not dropout,
            rngs=nnx.Rngs(dropout=1) if dropout else None)
    return jnp.sum(out["mlm_logits"] * 1e-2), out["mlm_logits"]

  (_, logits), grads = jax.value_and_grad(f, has_aux=True)(params)
  return logits, grads


@pytest.fixture(scope="module")
def batch():
  return benchmarking.synthetic_batches(1, 4, 32, 5, 256)[0]


@pytest.mark.slow
@pytest.mark.parametrize("option", [
    dict(fused_qkv=True),
    dict(attention_impl="dot_product_attention"),
    dict(remat_policy="full"),
    dict(remat_policy="dots"),
])
def test_speed_options_compute_the_same_model(option, batch):
  """Each option changes how, not what: same logits and gradients."""
  base = tiny_config().model
  base.attention_probs_dropout_prob = 0.0
  other = tiny_config(**option).model
  other.attention_probs_dropout_prob = 0.0
  l0, g0 = forward_and_grad(base, batch)
  l1, g1 = forward_and_grad(other, batch)
  np.testing.assert_allclose(l1, l0, atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(b, a, atol=1e-5, rtol=1e-4)
  # The param tree (HF names) does not depend on the option.
  shapes = lambda c: jax.tree.map(
      lambda x: x.shape, nnx.state(nnx.eval_shape(
          lambda: bert.BertForPreTraining(c, rngs=nnx.Rngs(0))),
          nnx.Param).to_pure_dict())
  assert shapes(other) == shapes(base)


@pytest.mark.slow
def test_dot_product_attention_honours_padding(batch):
  """Padded keys get no weight: changing padded tokens changes nothing."""
  config = tiny_config(attention_impl="dot_product_attention").model
  changed = dict(batch)
  changed["input_ids"] = np.where(batch["input_mask"] > 0, batch["input_ids"],
                                  7)
  l0, _ = forward_and_grad(config, batch)
  l1, _ = forward_and_grad(config, changed)
  assert (batch["input_mask"] == 0).any()
  np.testing.assert_allclose(l1, l0, atol=1e-5)


def test_fused_attention_refuses_attention_dropout(batch):
  config = tiny_config(attention_impl="dot_product_attention").model
  config.attention_probs_dropout_prob = 0.1
  with pytest.raises(ValueError, match="attention_probs_dropout_prob=0"):
    forward_and_grad(config, batch, dropout=True)


def test_unknown_options_are_named():
  with pytest.raises(ValueError, match="model.attention_impl"):
    bert.validate_model_config(tiny_config(attention_impl="flash").model)
  with pytest.raises(ValueError, match="model.remat_policy"):
    bert.validate_model_config(tiny_config(remat_policy="some").model)


@pytest.mark.slow
def test_train_step_compiles_once_over_varied_data():
  """Different masks, lengths and labels every step: one compilation."""
  config = tiny_config()
  mesh = sharding.make_mesh(config.mesh)
  programs = steps_lib.Programs(config, mesh)
  batches = benchmarking.synthetic_batches(4, 8, 32, 5, 256, seed=3)
  compiles = []

  def listener(event, *args, **kwargs):
    if event == "/jax/compilation_cache/compile_requests_use_cache":
      compiles.append(event)

  with programs.context():
    state = programs.init()
    first = sharding.global_batch(batches[0], programs.batch_sharding)
    state, metrics = programs.train_step(state, first)
    after_first = programs.train_step._cache_size()
    jax.monitoring.register_event_listener(listener)
    try:
      for i in range(1, 5):
        b = sharding.global_batch(batches[i % 4], programs.batch_sharding)
        state, metrics = programs.train_step(state, b)
      loss = jax.device_get(metrics["loss"])
    finally:
      jax.monitoring.unregister_event_listener(listener)
  assert np.isfinite(loss)
  assert after_first == 1
  assert programs.train_step._cache_size() == 1
  assert compiles == []


@pytest.mark.slow
def test_benchmark_cli_json_with_pytorch_peer():
  """The documented command prints one JSON object with the ratios."""
  out = run_tool(
      "benchmark.py", "--config", os.path.join(REPO, "configs", "tiny.py"),
      "--steps", "2", "--rounds", "1", "--json", "--compare", "--peers",
      "torch", "--config.model.vocab_size=256",
      "--config.model.hidden_size=64", "--config.model.num_attention_heads=4",
      "--config.model.intermediate_size=128", "--config.data.seq_length=32",
      "--config.train.batch_size=8", "--config.data.max_predictions_per_seq=5")
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["tokens_per_sec"] > 0 and 0 < result["mfu"]
  assert result["timed_steps"] == 2 and result["step_time_p90"] >= \
      result["step_time_p50"] > 0
  assert result["config"]["batch_size"] == 8
  assert result["tokens_per_sec"] == pytest.approx(
      8 * 32 / result["step_time_p50"])
  assert result["pytorch"]["timed_steps"] == 2
  assert result["vs_pytorch"] == pytest.approx(
      result["tokens_per_sec"] / result["pytorch"]["tokens_per_sec"])


def test_seq_length_cells_keep_tokens_per_batch():
  """batch = tokens / seq, predictions per token as in the config, one
  position table for all, kinds that cannot run listed."""
  config = tiny_config()  # seq 32, 5 predictions, 64 positions.
  cells = bench_seq_lengths.seq_length_configs(
      config, [32, 64, 128], 1024, ["xla", "dot_product_attention", "splash",
                                    "cudnn"], "cpu")
  runs = {(t, k): c for t, k, c in cells}
  assert len(cells) == 12
  for t in (32, 64, 128):
    c = runs[(t, "xla")]
    assert c.train.batch_size * c.data.seq_length == 1024
    assert c.data.max_predictions_per_seq == 5 * t // 32
    assert c.model.max_position_embeddings == 128
    assert c.model.attention_probs_dropout_prob == \
        config.model.attention_probs_dropout_prob
    fused = runs[(t, "dot_product_attention")]
    assert fused.model.attention_impl == "dot_product_attention"
    assert fused.model.attention_probs_dropout_prob == 0.0
    assert runs[(t, "splash")] is None and runs[(t, "cudnn")] is None
  tpu = dict(((t, k), c) for t, k, c in bench_seq_lengths.seq_length_configs(
      config, [64, 128], 1024, ["splash"], "tpu"))
  assert tpu[(64, "splash")] is None  # Not a multiple of 128.
  assert tpu[(128, "splash")].model.attention_impl == "splash"
  assert config.data.seq_length == 32  # The caller's config is untouched.
  with pytest.raises(ValueError, match="--tokens_per_batch=1000"):
    bench_seq_lengths.seq_length_configs(config, [64], 1000, ["xla"], "cpu")


@pytest.mark.slow
def test_bench_seq_lengths_cli_json():
  """One row per (length, kind); the FLOP ratio is flops.py's."""
  from bert_jax.models import flops as flops_lib
  out = run_tool(
      "bench_seq_lengths.py", "--config", os.path.join(REPO, "configs", "tiny.py"),
      "--seq_lengths", "16,32", "--tokens_per_batch", "128", "--attention",
      "xla,splash", "--steps", "1", "--rounds", "1", "--warmup", "0",
      "--json", "--config.model.vocab_size=256",
      "--config.model.hidden_size=64", "--config.model.num_attention_heads=4",
      "--config.model.intermediate_size=128", "--config.data.seq_length=32",
      "--config.data.max_predictions_per_seq=4",
      "--config.train.peak_tflops=1.0")
  assert out.returncode == 0, out.stderr[-3000:]
  rows = json.loads(out.stdout.strip().splitlines()[-1])
  assert [(r["seq_length"], r["attention"], r["runs"]) for r in rows] == [
      (16, "xla", True), (16, "splash", False), (32, "xla", True),
      (32, "splash", False)]
  short, long = rows[0], rows[2]
  assert (short["batch_size"], long["batch_size"]) == (8, 4)
  assert (short["max_predictions_per_seq"],
          long["max_predictions_per_seq"]) == (2, 4)
  assert short["time_ratio"] == 1.0 and long["time_ratio"] > 0
  model = tiny_config().model  # The CLI overrides above.
  expected = (flops_lib.train_flops_per_token(model, 32, 4)
              / flops_lib.train_flops_per_token(model, 16, 2))
  assert long["flops_ratio"] == pytest.approx(expected)
  assert long["us_per_token"] == pytest.approx(
      1e6 * long["step_time_p50"] / 128)


def test_modernbert_peers_are_the_sparse_head_then_the_dense_one():
  benchmark = helpers.import_tool("benchmark")
  specs = benchmark.peer_specs("modernbert", ("torch",), {"x": 1}, "float32",
                               "b.npz")
  assert [(name, kind, spec.get("sparse_prediction"))
          for name, kind, spec in specs] == [
              ("pytorch", "torch", True), ("pytorch_dense", "torch", False)]
  specs = benchmark.peer_specs("bert", ("flax", "torch"), {}, "float32", "b")
  assert [(n, k) for n, k, _ in specs] == [("hf_flax", "flax"),
                                           ("pytorch", "torch")]
  assert "sparse_prediction" not in specs[1][2]


def test_modernbert_sparse_peer_computes_logits_at_the_masked_positions_only(
    tmp_path):
  """The fair peer: ModernBertConfig(sparse_prediction=True) gives one row
  of logits per masked position (the dense head: every position) and the
  same loss, from the same batches ours trains on."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from bert_jax.families import modernbert as modernbert_family
  from tests.helpers import family_checks
  peer = helpers.import_tool("bench_peer")
  benchmark = helpers.import_tool("benchmark")
  model = family_checks.family_config("modernbert").model
  batches = benchmarking.synthetic_batches(2, 4, 32, 5, model.vocab_size)
  path = str(tmp_path / "batches.npz")
  benchmark.write_batches(path, batches)
  spec = dict(bert_config=modernbert_family.config_to_hf(model),
              family="modernbert", dtype="float32", batches=path)
  out = {}
  for sparse in (True, False):
    s = dict(spec, sparse_prediction=sparse)
    m = peer.torch_model(s).eval()  # No dropout: the two runs compare.
    (b, _) = peer.torch_batches(s)
    with torch.no_grad():
      out[sparse] = m(**b)
  masked = int(batches[0]["masked_lm_weights"].sum())
  assert tuple(out[True].logits.shape) == (masked, model.vocab_size)
  assert tuple(out[False].logits.shape) == (4, 32, model.vocab_size)
  assert float(out[True].loss) == pytest.approx(float(out[False].loss),
                                                rel=1e-5)
  np.testing.assert_array_equal(peer.read_batches(path)[1]["input_ids"],
                                batches[1]["input_ids"])


def test_roberta_sparse_peer_is_the_dense_loss_at_the_masked_positions(
    tmp_path):
  """The fair RoBERTa peer (transformers has no sparse head option: the
  encoder and lm_head on the gathered positions) gives
  RobertaForMaskedLM's own loss on the same batches; peer_specs runs it
  first, then the dense one."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests.helpers import family_checks
  peer = helpers.import_tool("bench_peer")
  benchmark = helpers.import_tool("benchmark")
  assert [(n, s.get("sparse_prediction")) for n, _, s in benchmark.peer_specs(
      "roberta", ("torch",), {}, "float32", "b")] == [
          ("pytorch", True), ("pytorch_dense", False)]
  config = family_checks.family_config("roberta")
  batches = benchmarking.synthetic_batches(2, 4, 32, 5,
                                           config.model.vocab_size)
  path = str(tmp_path / "batches.npz")
  benchmark.write_batches(path, batches)
  table = compose.family(config).pretraining_tables[0]
  spec = dict(bert_config=table.config_to_hf(config.model),
              family="roberta", dtype="float32", batches=path)
  losses = {}
  for sparse in (True, False):
    s = dict(spec, sparse_prediction=sparse)
    m = peer.torch_model(s).eval()  # No dropout: the two runs compare.
    b = peer.torch_batches(s)[0]
    with torch.no_grad():
      losses[sparse] = float(peer.roberta_sparse_loss(m, b) if sparse
                             else m(**b).loss)
  assert type(m).__name__ == "RobertaForMaskedLM"
  assert losses[True] == pytest.approx(losses[False], rel=1e-5)


@pytest.mark.slow
def test_bench_variants_cli_json():
  """Each variant alternates with the base; gather=False is the full-logits
  ablation of the same loss."""
  out = run_tool(
      "bench_variants.py", "--config", os.path.join(REPO, "configs",
                                                    "tiny.py"),
      "--variant=full:gather=False", "--variant=fused:model.fused_qkv=True",
      "--steps", "1", "--rounds", "2", "--warmup", "0", "--json",
      "--config.model.vocab_size=256", "--config.model.hidden_size=64",
      "--config.model.num_attention_heads=4",
      "--config.model.intermediate_size=128", "--config.data.seq_length=32",
      "--config.train.batch_size=8", "--config.data.max_predictions_per_seq=5",
      "--config.train.peak_tflops=1.0")
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert list(result) == ["base", "full", "fused"]
  assert result["base"]["vs_base"] == 1.0
  for v in result.values():
    assert v["tokens_per_sec"] == pytest.approx(8 * 32 / v["step_time_p50"])
    assert v["vs_base"] == pytest.approx(
        v["tokens_per_sec"] / result["base"]["tokens_per_sec"])
