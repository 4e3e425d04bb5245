"""ELECTRA: replacement statistics, gradient routing, sizes, HF parity.

Tiny shapes throughout (2 layers x 64, embedding 32, generator 1/4 = 16
wide), so every test runs in seconds on CPU.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import config_lib
from bert_jax import export
from bert_jax import pretrained
from bert_jax.families import electra as electra_family
from bert_jax.hf import mapping
from bert_jax.models import electra as electra_model
from bert_jax.objectives import electra
from tests import helpers
from tests.helpers.electra_batches import BATCH
from tests.helpers.electra_batches import PREDS
from tests.helpers.electra_batches import SEQ
from tests.helpers.electra_batches import VOCAB
from tests.helpers.electra_batches import masked_batch
from tests.helpers.electra_batches import tiny_electra_config


def config_file(name: str):
  return helpers.load_config(name)






def make(config, seed=0):
  return electra.make_model(config, nnx.Rngs(seed))


# ---------------------------------------------------------------------------
# Model shapes and sizes.
# ---------------------------------------------------------------------------
def test_generator_config_follows_google_rule():
  c = tiny_electra_config()
  g = electra_model.generator_config(c)
  assert (g.hidden_size, g.num_attention_heads, g.intermediate_size,
          g.num_hidden_layers, g.embedding_size) == (16, 1, 64, 2, 32)
  g = electra_model.generator_config(config_file("electra_small"))
  assert (g.hidden_size, g.num_attention_heads, g.intermediate_size) == (
      64, 1, 256)
  g = electra_model.generator_config(config_file("electra_base"))
  assert (g.hidden_size, g.num_attention_heads, g.intermediate_size) == (
      256, 4, 1024)


def test_bad_generator_size_is_one_clear_error():
  with pytest.raises(ValueError, match="generator_hidden_size"):
    electra_model.generator_config(tiny_electra_config(
        generator_hidden_size=1.5))
  with pytest.raises(ValueError, match="generator_num_attention_heads"):
    electra_model.generator_config(tiny_electra_config(
        generator_hidden_size=0.25, generator_num_attention_heads=3))


def test_embeddings_are_one_table_and_projected_per_network():
  m = make(tiny_electra_config())
  p = nnx.state(m, nnx.Param).to_pure_dict()
  assert p["embeddings"]["word_embeddings"].shape == (VOCAB, 32)
  assert p["generator"]["encoder"]["embeddings_project"]["kernel"].shape == (
      32, 16)
  assert p["discriminator"]["encoder"]["embeddings_project"][
      "kernel"].shape == (32, 64)
  assert "word_embeddings" not in str(jax.tree_util.tree_structure(
      p["generator"])) + str(jax.tree_util.tree_structure(p["discriminator"]))
  # The generator decodes into E with the shared table.
  assert p["generator"]["mlm_head"]["transform"]["kernel"].shape == (16, 32)
  # E == H: no projection on the discriminator (ELECTRA-Base).
  m = make(tiny_electra_config(embedding_size=64))
  assert m.discriminator.encoder.embeddings_project is None
  assert m.generator.encoder.embeddings_project is not None


def test_every_param_has_logical_axes():
  m = nnx.eval_shape(lambda: make(tiny_electra_config()))
  for path, var in nnx.to_flat_state(nnx.state(m, nnx.Param)):
    axes = var.get_metadata().get("out_sharding")
    assert axes is not None and len(axes) == len(var.get_value().shape), path


@pytest.mark.slow
@pytest.mark.parametrize("config_name", ["electra_small", "electra_base"])
def test_parameter_counts_match_hugging_face(config_name):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  config = config_file(config_name)
  counts = electra_model.count_params(nnx.eval_shape(
      lambda: electra_model.ElectraForPreTraining(config, rngs=nnx.Rngs(0))))

  def hf_count(network, cls):
    hf_cfg = transformers.ElectraConfig(
        **electra_family.TABLES[network].config_to_hf(
            electra_family.network_config(config, network)))
    with torch.device("meta"):
      model = cls(hf_cfg)
    return sum(p.numel() for p in model.parameters())  # Tied: counted once.

  assert counts["shared"] + counts["discriminator"] == hf_count(
      "discriminator", transformers.ElectraForPreTraining)
  assert counts["shared"] + counts["generator"] == hf_count(
      "generator", transformers.ElectraForMaskedLM)


# ---------------------------------------------------------------------------
# Replacement: who is replaced, and how often.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_discriminator_input_and_label_rule_exact():
  c = tiny_electra_config()
  m = make(c)
  batch, original = masked_batch()
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  logits = m.generator_logits(batch["input_ids"], batch["input_mask"],
                              batch["segment_ids"],
                              batch["masked_lm_positions"])
  for seed in range(5):
    corrupted, labels, samples = map(np.asarray, electra.replace_tokens(
        logits, batch, jax.random.key(seed), 1.0))
    expected = original.copy()
    w = np.asarray(batch["masked_lm_weights"])
    pos = np.asarray(batch["masked_lm_positions"])
    for b in range(BATCH):
      for j in range(PREDS):
        if w[b, j] > 0:
          expected[b, pos[b, j]] = samples[b, j]
    np.testing.assert_array_equal(corrupted, expected)
    # [CLS] (position 0, where the padded prediction slots point) is
    # untouched.
    np.testing.assert_array_equal(corrupted[:, 0], original[:, 0])
    np.testing.assert_array_equal(labels, (expected != original).astype(int))


@pytest.mark.slow
def test_replaced_share_matches_the_generator_distribution():
  """Over many batches, P(replaced) at a masked slot = 1 - p_gen(original);
  a sampled token equal to the original is labelled original. The generator
  is biased towards one token so that 'sampled == original' is common."""
  c = tiny_electra_config()
  m = make(c)
  favourite = 7
  m.generator.mlm_head.bias[...] = m.generator.mlm_head.bias[...].at[
      favourite].set(7.0)
  batch, original = masked_batch(seed=1)
  w = batch["masked_lm_weights"]
  # Half the masked originals are the favourite token.
  ids = np.where((np.arange(PREDS)[None] % 2 == 0) & (w > 0), favourite,
                 batch["masked_lm_ids"]).astype(np.int32)
  for b in range(BATCH):
    for j in range(PREDS):
      if w[b, j] > 0:
        original[b, batch["masked_lm_positions"][b, j]] = ids[b, j]
  batch["masked_lm_ids"] = ids
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  logits = m.generator_logits(batch["input_ids"], batch["input_mask"],
                              batch["segment_ids"],
                              batch["masked_lm_positions"])
  p_orig = np.take_along_axis(np.asarray(jax.nn.softmax(logits, -1)),
                              np.asarray(ids)[..., None], -1)[..., 0]
  expected = np.sum((1 - p_orig) * w) / np.sum(w)
  assert 0.2 < expected < 0.9  # The test can tell the rule apart.

  runs = 400
  fn = jax.jit(lambda k: electra.replace_tokens(logits, batch, k, 1.0)[1])
  replaced = sum(float(jnp.sum(fn(jax.random.key(s)))) for s in range(runs))
  share = replaced / (runs * np.sum(w))
  n = runs * np.sum(w)
  se = np.sqrt(expected * (1 - expected) / n)
  assert abs(share - expected) < 5 * se, (share, expected, se)
  # Per favourite slot: replaced iff the sample is not the favourite.
  fav = (np.asarray(ids) == favourite) & (w > 0)
  exp_fav = np.sum((1 - p_orig) * fav) / np.sum(fav)
  assert exp_fav < 0.5 * expected  # Mostly re-sampled as itself.


def test_metrics_count_replaced_tokens_over_real_tokens():
  c = tiny_electra_config()
  m = make(c)
  batch, _ = masked_batch(seed=2)
  batch = {k: jnp.asarray(v) for k, v in batch.items()}
  key = jax.random.key(3)
  sums = electra.loss_sums(m, batch, key, True, c)
  counts = electra.counts(batch, c)
  out = electra.metrics(sums, counts, c)
  logits = m.generator_logits(batch["input_ids"], batch["input_mask"],
                              batch["segment_ids"],
                              batch["masked_lm_positions"])
  _, labels, _ = electra.replace_tokens(logits, batch,
                                        jax.random.split(key)[0], 1.0)
  real = np.asarray(batch["input_mask"]).sum()
  assert float(counts["disc_weight"]) == real
  np.testing.assert_allclose(float(out["replaced_share"]),
                             np.asarray(labels).sum() / real, rtol=1e-6)
  assert 0 < float(out["replaced_share"]) <= np.asarray(
      batch["masked_lm_weights"]).sum() / real
  np.testing.assert_allclose(
      float(out["loss"]), float(out["mlm_loss"]) + 50 * float(out["disc_loss"]),
      rtol=1e-6)
  for k in ("disc_accuracy", "disc_precision", "disc_recall", "mlm_accuracy"):
    assert 0.0 <= float(out[k]) <= 1.0


# ---------------------------------------------------------------------------
# Gradients: the discriminator's loss never reaches the generator.
# ---------------------------------------------------------------------------
def _grads_fn(config, graphdef, batch):
  """jit(grad) of gen_weight * MLM mean + disc_weight * BCE mean, the two
  weights traced (one compile for every mix)."""

  def f(p, gen_weight, disc_weight):
    model = nnx.merge(graphdef, p)
    sums = electra.loss_sums(model, batch, jax.random.key(0), True, config)
    counts = electra.counts(batch, config)
    return (gen_weight * sums["mlm_loss"] / counts["mlm_weight"]
            + disc_weight * sums["disc_loss"] / counts["disc_weight"])

  return jax.jit(jax.grad(f))


def _norms(tree):
  return jax.tree.map(lambda g: float(jnp.max(jnp.abs(g))), tree)


@pytest.mark.slow
def test_discriminator_loss_gives_generator_no_gradient():
  c = tiny_electra_config()
  graphdef, params = nnx.split(make(c), nnx.Param)
  params = params.to_pure_dict()
  batch = {k: jnp.asarray(v) for k, v in masked_batch()[0].items()}
  grads = _grads_fn(c, graphdef, batch)
  disc = grads(params, 0.0, 1.0)
  gen = grads(params, 1.0, 0.0)
  both = grads(params, 1.0, 50.0)
  # Exactly zero on every generator-only parameter from the disc loss ...
  assert all(v == 0.0 for v in jax.tree.leaves(_norms(disc["generator"])))
  # ... and on every discriminator parameter from the generator loss.
  assert all(v == 0.0 for v in jax.tree.leaves(
      _norms(gen["discriminator"])))
  # The generator and discriminator do learn from their own losses.
  assert all(v > 0 for v in jax.tree.leaves(_norms(
      disc["discriminator"]["encoder"]["layers"])))
  assert all(v > 0 for v in jax.tree.leaves(_norms(
      gen["generator"]["encoder"]["layers"])))
  # The shared embeddings get gradient from both, and the total is the
  # weighted sum.
  for name in ("word_embeddings", "position_embeddings"):
    g_d, g_g = disc["embeddings"][name], gen["embeddings"][name]
    assert float(jnp.max(jnp.abs(g_d))) > 0
    assert float(jnp.max(jnp.abs(g_g))) > 0
    np.testing.assert_allclose(both["embeddings"][name], g_g + 50 * g_d,
                               rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------
# Hugging Face: export parity and exact round trip.
# ---------------------------------------------------------------------------
def _randomized_params(config, seed=0):
  """A model whose every param (LayerNorms and biases too) is random."""
  graphdef, params = nnx.split(make(config, seed), nnx.Param)
  leaves, tree = jax.tree.flatten(params.to_pure_dict())
  keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
  leaves = [x + 0.05 * jax.random.normal(k, x.shape) for x, k in
            zip(leaves, keys)]
  return graphdef, jax.tree.unflatten(tree, leaves)


@pytest.mark.slow
@pytest.mark.parametrize("embedding_size", [32, 64])
def test_hf_export_logits_match_pytorch(tmp_path, embedding_size):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  c = tiny_electra_config(embedding_size=embedding_size)
  graphdef, params = _randomized_params(c)
  written = export.write_hf_models(str(tmp_path), params, c)
  assert "discriminator/model.safetensors" in written
  assert "generator/config.json" in written
  model = nnx.merge(graphdef, params)
  batch, _ = masked_batch(seed=5, batch=4)
  args = [jnp.asarray(batch[k]) for k in ("input_ids", "input_mask",
                                          "segment_ids")]
  ours_d = np.asarray(model.discriminator_logits(*args))
  ours_g = np.asarray(model.generator_logits(*args))
  t = {k: torch.tensor(np.asarray(batch[k]), dtype=torch.long)
       for k in ("input_ids", "input_mask", "segment_ids")}
  kw = dict(input_ids=t["input_ids"], attention_mask=t["input_mask"],
            token_type_ids=t["segment_ids"])
  with torch.no_grad():
    disc = transformers.ElectraForPreTraining.from_pretrained(
        tmp_path / "discriminator").eval()
    gen = transformers.ElectraForMaskedLM.from_pretrained(
        tmp_path / "generator").eval()
    theirs_d = disc(**kw).logits.numpy()
    theirs_g = gen(**kw).logits.numpy()
  real = batch["input_mask"].astype(bool)
  err_d = np.max(np.abs(ours_d - theirs_d)[real])
  err_g = np.max(np.abs(ours_g - theirs_g)[real])
  print(f"E={embedding_size}: max |logit diff| discriminator {err_d:.2e}, "
        f"generator {err_g:.2e}")
  assert err_d < 1e-4 and err_g < 1e-4
  # The generator's decoder really is the shared word-embedding table.
  np.testing.assert_array_equal(
      gen.generator_lm_head.weight.detach().numpy(),
      np.asarray(params["embeddings"]["word_embeddings"]))


def test_hf_round_trip_is_exact(tmp_path):
  c = tiny_electra_config(generator_hidden_size=0.5)
  _, params = _randomized_params(c, seed=3)
  export.write_hf_models(str(tmp_path), params, c)
  source = pretrained.resolve(str(tmp_path))
  back, _ = pretrained.load_params(source)
  config = source.config
  a, b = mapping.flatten_params(params), mapping.flatten_params(back)
  assert set(a) == set(b)
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), b[k], err_msg=k)
  for f in ("hidden_size", "num_attention_heads", "intermediate_size",
            "num_hidden_layers", "embedding_size"):
    assert electra_model.generator_config(config)[f] == (
        electra_model.generator_config(c)[f])
    assert config.model[f] == c.model[f] or f == "embedding_size"
  assert config.model.embedding_size == 32


def test_hf_import_rejects_untied_embeddings(tmp_path):
  c = tiny_electra_config()
  _, params = _randomized_params(c)
  sds = {n: mapping.to_hf_state_dict(electra_family.network_params(params, n),
                                 electra_family.TABLES[n])
         for n in electra_family.NETWORKS}
  sds["generator"]["electra.embeddings.position_embeddings.weight"] += 1e-3
  with pytest.raises(ValueError, match="position_embeddings"):
    electra_family.from_hf_state_dicts(sds, c)


# ---------------------------------------------------------------------------
# FLOPs: both networks.
# ---------------------------------------------------------------------------
@pytest.mark.slow
def test_flops_count_both_networks_and_match_xla():
  from bert_jax import compose
  c = tiny_electra_config()
  c.train.batch_size = BATCH
  t, p = SEQ, PREDS
  # By hand: generator 2 x 16 (FFN 64), discriminator 2 x 64 (FFN 256),
  # E = 32, V = 128.
  gen = 6 * 2 * (4 * 16**2 + 2 * 16 * 64) + 12 * 2 * t * 16 + 6 * 32 * 16
  disc = 6 * 2 * (4 * 64**2 + 2 * 64 * 256) + 12 * 2 * t * 64 + 6 * 32 * 64
  per_seq = (t * gen + p * 6 * (16 * 32 + 32 * VOCAB)
             + t * (disc + 6 * (64 * 64 + 64)))
  assert compose.train_flops_per_step(c) == BATCH * per_seq
  # The lowered loss+gradient of a wider model agrees within 5% (the
  # formula leaves out elementwise ops, embedding gathers and the sampling).
  c.model.update(hidden_size=256, intermediate_size=1024, embedding_size=128)
  graphdef, params = nnx.split(nnx.eval_shape(lambda: make(c)), nnx.Param)
  batch = {k: jnp.asarray(v) for k, v in masked_batch()[0].items()}

  def loss(p):
    model = nnx.merge(graphdef, p)
    sums = electra.loss_sums(model, batch, jax.random.key(0), True, c)
    return electra.loss(sums, electra.counts(batch, c), c)

  xla = jax.jit(jax.grad(loss)).lower(params).cost_analysis()["flops"]
  assert xla == pytest.approx(compose.train_flops_per_step(c), rel=0.05)


def test_registered_tables_build_each_network_alone(tmp_path):
  """The hf registry's ELECTRA families: a network imported alone (as
  fine-tuning or fill-mask would) gives the pair's logits exactly."""
  c = tiny_electra_config()
  graphdef, params = _randomized_params(c)
  pair = nnx.merge(graphdef, params)
  batch, _ = masked_batch(seed=6, batch=2)
  args = [jnp.asarray(batch[k]) for k in ("input_ids", "input_mask",
                                          "segment_ids")]
  for network, net_config, ours in (
      ("discriminator", c.model, pair.discriminator_logits(*args)),
      ("generator", electra_model.generator_config(c),
       pair.generator_logits(*args))):
    sub = {"embeddings": params["embeddings"], network: params[network]}
    model = mapping.make_model(sub, net_config, electra_family.TABLES[network])
    theirs = model(*args)
    theirs = theirs["mlm_logits"] if network == "generator" else theirs
    np.testing.assert_array_equal(np.asarray(theirs), np.asarray(ours))


def test_objective_name_alone_selects_electra_with_defaults():
  """--config.objective.name=electra on a BERT config: ELECTRA's defaults
  (generator 1/4 wide, weights 1 and 50), embeddings unfactorized."""
  from bert_jax import compose
  c = config_lib.get_config("tiny")
  c.model.update(vocab_size=VOCAB, max_position_embeddings=64)
  c.objective.name = "electra"
  obj = compose.objective(c)
  assert obj.name == "electra"
  m = nnx.eval_shape(lambda: obj.make_model(c, nnx.Rngs(0)))
  assert m.generator.encoder.embeddings_project is not None
  g = electra_model.generator_config(c)
  assert (g.hidden_size, g.embedding_size) == (32, 128)
  assert m.discriminator.encoder.embeddings_project is None
  assert c.objective.disc_weight == 50.0


@pytest.mark.slow
def test_objective_name_on_base_samples_the_generator_at_temperature_one():
  """--config.objective.name=electra on configs/base.py: the generator is
  sampled at objective.generator_temperature (1.0 unless set), never at
  DistilBERT's objective.temperature (2.0 by default, in every config). The
  samples show in loss_sums through the discriminator's loss."""
  def sums(**objective):
    c = config_file("base")
    c.objective.name = "electra"
    c.objective.update(objective)
    c.model.update(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                   num_attention_heads=4, intermediate_size=256,
                   max_position_embeddings=64)
    assert c.objective.temperature == 2.0  # DistilBERT's default is there.
    m = make(c)
    # A sharp generator (logits spread over ~6 nats), so that the
    # temperature changes which tokens are drawn.
    bias = m.generator.mlm_head.bias
    bias[...] = 3.0 * jax.random.normal(jax.random.key(7), bias[...].shape)
    batch = {k: jnp.asarray(v) for k, v in masked_batch(seed=3)[0].items()}
    out = electra.loss_sums(m, batch, jax.random.key(11), True, c)
    return {k: float(v) for k, v in out.items()}

  default, one, two = sums(), sums(generator_temperature=1.0), sums(
      generator_temperature=2.0)
  assert default == one
  # Other samples, another discriminator input (same weights, same rng).
  assert default["disc_loss"] != two["disc_loss"], (default, two)
  assert default["mlm_loss"] == two["mlm_loss"]  # The generator is the same.


@pytest.mark.slow
def test_both_networks_learn_on_a_fixed_batch():
  """The loss trains both networks (a loss term with no gradient path to its
  network, or of the wrong sign, fails this): 200 Adam steps on one batch
  take the discriminator well past the always-'original' base rate, and the
  generator's MLM loss falls (metrics averaged over the last 10 steps: each
  step samples anew)."""
  import optax
  c = tiny_electra_config()
  graphdef, params = nnx.split(make(c), nnx.Param)
  params = params.to_pure_dict()
  batch = {k: jnp.asarray(v) for k, v in masked_batch()[0].items()}
  tx = optax.adam(1e-3)

  def loss(p, key):
    sums = electra.loss_sums(nnx.merge(graphdef, p), batch, key, True, c)
    return electra.loss(sums, electra.counts(batch, c), c), sums

  @jax.jit
  def step(p, opt, key):
    (_, sums), g = jax.value_and_grad(loss, has_aux=True)(p, key)
    updates, opt = tx.update(g, opt, p)
    return optax.apply_updates(p, updates), opt, sums

  opt = tx.init(params)
  history = []
  for i in range(200):
    params, opt, sums = step(params, opt, jax.random.key(i))
    history.append({k: float(v) for k, v in electra.metrics(
        sums, electra.counts(batch, c), c).items()})
  first = history[0]
  last = {k: np.mean([h[k] for h in history[-10:]]) for k in first}
  assert last["mlm_loss"] < 0.6 * first["mlm_loss"]
  assert last["disc_accuracy"] > 1 - last["replaced_share"] + 0.02
  assert last["disc_recall"] > 0.3 and last["disc_precision"] > 0.3
