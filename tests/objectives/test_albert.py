"""ALBERT: sizes vs Hugging Face, shared-layer gradients, n-gram masking,
HF export/import parity, 1-vs-8-device losses and resume."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import config_lib
from bert_jax import families
from bert_jax import pretrained
from bert_jax.families import albert as albert_family
from bert_jax.hf import checkpoint_io
from bert_jax.hf import importing
from bert_jax.hf import mapping
from bert_jax.models import albert
from bert_jax.models import bert
from bert_jax.training import steps as steps_lib
from tests import helpers
from tests.helpers import family_checks
from tests.helpers import synthetic_batch

REPO = helpers.REPO


def _load_config(name):
  return family_checks.load_config(name)


def tiny_albert(**kw):
  mc = config_lib.model_config("tiny")
  mc.update(vocab_size=300, hidden_size=64, embedding_size=24,
            num_attention_heads=4, intermediate_size=128, num_hidden_layers=3,
            max_position_embeddings=64, hidden_act="gelu_new",
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            classifier_dropout_prob=0.0)
  mc.update(kw)
  return mc


def random_params(module, seed=0):
  """The module's params plus noise (zero-init biases become non-zero)."""
  r = np.random.RandomState(seed)
  return jax.tree.map(
      lambda x: np.asarray(x) + r.normal(0, 0.02, x.shape).astype(np.float32),
      nnx.state(module, nnx.Param).to_pure_dict())


# ------------------------------------------------------------------------------
# Sizes.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize("name,expected", [("albert_base", 11_813_810),
                                           ("albert_large", 17_847_474)])
def test_param_count_equals_hugging_face(name, expected):
  from transformers import AlbertConfig
  from transformers import AlbertForPreTraining
  config = _load_config(name)
  ours = bert.count_params(nnx.eval_shape(
      lambda: albert.AlbertForPreTraining(config.model, rngs=nnx.Rngs(0))))
  hf = AlbertForPreTraining(AlbertConfig(
      **albert_family.ALBERT.config_to_hf(config.model)))
  assert ours == sum(p.numel() for p in hf.parameters()) == expected
  # One block's params whatever the depth: 24 layers cost what 12 do.
  assert config.model.num_hidden_groups == config.model.inner_group_num == 1


def test_configs_follow_the_published_recipe():
  for name in ("albert_base", "albert_large"):
    c = _load_config(name)
    assert c.objective.name == "albert" and c.train.optimizer == "lamb"
    assert c.train.learning_rate == 0.00176 and c.train.batch_size == 4096
    assert c.data.objective == "sop" and c.data.max_ngram == 3
    assert c.model.embedding_size == 128 and c.model.vocab_size == 30000


# ------------------------------------------------------------------------------
# Shared layers.
# ------------------------------------------------------------------------------
@pytest.mark.slow
def test_shared_layer_gradient_is_the_sum_over_its_uses():
  """3 uses of one block vs 3 groups holding tied copies of it (HF's
  num_hidden_groups=3): same loss, and the shared gradient is the sum of the
  three copies' gradients."""
  config = config_lib.get_config("tiny")
  config.model = tiny_albert()
  config.objective.name = "albert"
  config.data.update(seq_length=32, max_predictions_per_seq=5)
  objective = families.objective("albert")
  shared = albert.AlbertForPreTraining(config.model, rngs=nnx.Rngs(0))
  params = random_params(shared)
  assert list(params["albert"]["groups"]) == [0]
  untied_config = config.copy_and_resolve_references()
  untied_config.model.num_hidden_groups = 3
  untied = albert.AlbertForPreTraining(untied_config.model, rngs=nnx.Rngs(1))
  untied_params = dict(params, albert=dict(
      params["albert"], groups={g: params["albert"]["groups"][0]
                                for g in range(3)}))
  batch = jax.tree.map(jnp.asarray, synthetic_batch(0, vocab=300))

  def grads(module, cfg, p):
    graphdef = nnx.split(module, nnx.Param)[0]
    return jax.value_and_grad(lambda q: steps_lib.batch_loss(
        q, batch, graphdef=graphdef, config=cfg, objective=objective))(p)

  loss_s, g_s = grads(shared, config, params)
  loss_u, g_u = grads(untied, untied_config, untied_params)
  np.testing.assert_allclose(loss_s, loss_u, rtol=1e-6)
  summed = jax.tree.map(lambda *x: sum(x),
                        *[g_u["albert"]["groups"][g] for g in range(3)])
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(
      g_s["albert"]["groups"][0])[0], jax.tree.leaves(summed)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=str(path))
    assert np.abs(a).max() > 0
  # Not just any one use: each copy alone differs from the shared gradient.
  one = g_u["albert"]["groups"][0]["layers"][0]["feed_forward"]["output"]
  full = g_s["albert"]["groups"][0]["layers"][0]["feed_forward"]["output"]
  assert np.abs(one["kernel"] - full["kernel"]).max() > 1e-3 * np.abs(
      full["kernel"]).max()
  np.testing.assert_allclose(g_s["mlm_head"]["bias"], g_u["mlm_head"]["bias"],
                             rtol=1e-4, atol=1e-7)


# ------------------------------------------------------------------------------
# N-gram masking (on tests/helpers/masking_corpus.py's ~130k tokens, the
# corpus of tests/data/test_masking.py).
# ------------------------------------------------------------------------------
from tests.helpers import masking_corpus  # noqa: E402
from tests.helpers.masking_corpus import P  # noqa: E402
from tests.helpers.masking_corpus import make  # noqa: E402
from tests.helpers.masking_corpus import outcomes  # noqa: E402
from tests.helpers.masking_corpus import run  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  return masking_corpus.corpus(tmp_path_factory.mktemp("mask"))


@pytest.mark.slow
@pytest.mark.parametrize("whole_word", [False, True])
def test_ngram_masking_statistics(data, whole_word):
  import tensorflow as tf
  tok, ids = data
  masker = make(tok, max_ngram=3, whole_word=whole_word)
  out = run(masker, ids)
  special = np.isin(ids, tok.special_ids)
  n_ok = (~special).sum(1)
  rate = out["masked_lm_weights"].sum() / n_ok.sum()
  assert 0.145 < rate <= 0.151, rate
  kind, rows, pos = outcomes(ids, out, tok)
  assert not special[rows, pos].any()
  frac = np.bincount(kind, minlength=3) / len(kind)
  # Per-span draws: fewer independent draws, so a looser band than per token.
  assert abs(frac[0] - 0.8) < 0.03 and abs(frac[1] - 0.1) < 0.02, frac

  # Spans of the first 256 rows, with the seeds `run` gave the masker
  # (batch seed [0, 0] split as Masker.__call__ does): cut with p(n) ~ 1/n
  # (6/11, 3/11, 2/11), never across specials, taken whole.
  ids, special, n_ok = ids[:256], special[:256], n_ok[:256]
  n_sel = np.minimum(P, np.maximum(1, np.round(0.15 * n_ok))).astype(np.int32)
  ok = tf.constant(~special)
  seeds = tf.random.experimental.stateless_split(
      tf.constant([0, 0], tf.int64), num=4)
  sel, span = masker._select_spans(tf.constant(ids), ok, tf.constant(n_sel),
                                   seeds[0], seeds[3])
  sel, span = sel.numpy(), span.numpy()
  w = out["masked_lm_weights"][:256] > 0
  np.testing.assert_array_equal(sel.sum(1), w.sum(1))
  units = masker._unit_starts(tf.constant(ids), ok).numpy()
  cut, taken = [], []
  for r in range(len(ids)):
    for s in np.unique(span[r][~special[r]]):
      inside = span[r] == s
      assert not special[r][inside].any()
      n = int(units[r][inside].sum())
      cut.append(n)
      if sel[r][inside].any():
        assert sel[r][inside].all()  # A span is taken whole.
        taken.append(n)
  assert max(cut) == 3
  p_cut = np.bincount(cut, minlength=4)[1:] / len(cut)
  np.testing.assert_allclose(p_cut, [6 / 11, 3 / 11, 2 / 11], atol=0.04)
  p_taken = np.bincount(taken, minlength=4)[1:] / len(taken)
  assert p_taken[0] > p_taken[1] > p_taken[2] > 0.05, p_taken

  # One 80/10/10 draw per span: a span is all [MASK] or has none.
  masked = out["input_ids"][:256] == tok.mask_id
  mixed = whole = 0
  for r in range(len(ids)):
    for s in np.unique(span[r][sel[r]]):
      inside = span[r] == s
      if inside.sum() > 1:
        whole += 1
        mixed += masked[r][inside].any() and not masked[r][inside].all()
  assert whole > 200 and mixed == 0, (whole, mixed)


@pytest.mark.slow
def test_ngram_masking_is_deterministic_per_seed(data):
  tok, ids = data
  masker = make(tok, max_ngram=3, whole_word=True)
  a, b = run(masker, ids[:512], seed=3), run(masker, ids[:512], seed=3)
  c = run(masker, ids[:512], seed=4)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
  assert (a["input_ids"] != c["input_ids"]).any()


# ------------------------------------------------------------------------------
# Hugging Face.
# ------------------------------------------------------------------------------
def test_export_matches_pytorch_and_round_trips(tmp_path):
  import torch
  from transformers import AlbertForMaskedLM
  from transformers import AlbertForPreTraining
  mc = tiny_albert()
  module = albert.AlbertForPreTraining(mc, rngs=nnx.Rngs(0))
  params = random_params(module)
  nnx.update(module, params)
  checkpoint_io.save_hf_model(str(tmp_path), params, mc,
                              table=albert_family.ALBERT)
  hf = AlbertForPreTraining.from_pretrained(str(tmp_path)).eval()
  r = np.random.RandomState(1)
  ids = r.randint(5, 300, (2, 16))
  mask = np.ones((2, 16), np.int32)
  mask[1, 10:] = 0
  seg = np.zeros((2, 16), np.int32)
  seg[:, 8:] = 1
  ours = module(jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(seg))
  t = lambda x: torch.tensor(x)
  with torch.no_grad():
    out = hf(input_ids=t(ids), attention_mask=t(mask), token_type_ids=t(seg))
    mlm = AlbertForMaskedLM.from_pretrained(str(tmp_path)).eval()(
        input_ids=t(ids), attention_mask=t(mask), token_type_ids=t(seg))
  real = mask > 0
  np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[real],
                             out.prediction_logits.numpy()[real], atol=1e-4)
  np.testing.assert_allclose(np.asarray(ours["nsp_logits"]),
                             out.sop_logits.numpy(), atol=1e-4)
  np.testing.assert_allclose(np.asarray(ours["mlm_logits"])[real],
                             mlm.logits.numpy()[real], atol=1e-4)
  source = pretrained.resolve(str(tmp_path))
  mc2 = pretrained.load_model_config(source)
  back, report = pretrained.load_params(source, mc2)
  assert source.table is albert_family.ALBERT and mc2.embedding_size == 24
  assert report.architecture == "AlbertForPreTraining" and not report.fresh
  jax.tree.map(np.testing.assert_array_equal, params, back)
  # And from the weights PyTorch itself holds (state_dict, tied copies).
  back2, _ = importing.from_hf_state_dict(
      {k: v.numpy() for k, v in hf.state_dict().items()}, mc,
      albert_family.ALBERT)
  jax.tree.map(np.testing.assert_array_equal, params, back2)
  # An AlbertForMaskedLM directory imports too: pooler and SOP head fresh.
  mlm_dir = str(tmp_path / "mlm")
  AlbertForMaskedLM.from_pretrained(str(tmp_path)).save_pretrained(mlm_dir)
  back3, report3 = pretrained.load_params(pretrained.resolve(mlm_dir), mc2)
  assert report3.fresh == ["albert.pooler", "sop_head"]
  np.testing.assert_array_equal(back3["mlm_head"]["bias"],
                                params["mlm_head"]["bias"])


# ------------------------------------------------------------------------------
# Meshes and resume.
# ------------------------------------------------------------------------------
@pytest.mark.slow
def test_one_vs_eight_devices_same_losses(tmp_path):
  family_checks.assert_meshes_agree("albert", tmp_path)


@pytest.mark.slow
def test_resume_continues_exactly_and_the_run_exports(tmp_path):
  """Stop-and-rerun from the step-4 checkpoint (state + data position, not
  kill -9: tests/training/test_resume.py covers that path for the shared
  trainer),
  then tools/convert_to_hf.py on the run: AlbertForPreTraining in PyTorch
  gives our logits, and fill_mask runs on the export."""
  import torch
  from transformers import AlbertForPreTraining

  from bert_jax.downstream import mask_filling
  workdir = family_checks.assert_resume_is_exact(
      tmp_path, "albert_base.py", "--config.model.num_hidden_layers=2",
      "--config.model.embedding_size=32", "--config.data.seq_length=32")
  out = str(tmp_path / "hf")
  family_checks.export_workdir(workdir, out)
  source = pretrained.resolve(workdir)
  mc = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, mc)
  ours = mapping.make_model(params, mc, albert_family.ALBERT)
  ids = np.random.RandomState(0).randint(5, 300, (2, 16))
  mask, seg = np.ones_like(ids), np.zeros_like(ids)
  want = np.asarray(ours(jnp.asarray(ids), jnp.asarray(mask),
                         jnp.asarray(seg))["mlm_logits"])
  with torch.no_grad():
    got = AlbertForPreTraining.from_pretrained(out).eval()(
        input_ids=torch.tensor(ids)).prediction_logits.numpy()
  np.testing.assert_allclose(got, want, atol=1e-4)
  result = mask_filling.fill_mask(out, "the [MASK] of the function .", top_k=2)
  assert len(result) == 2 and result[0]["score"] >= result[1]["score"]


def test_startup_check_refuses_unfactorized_embeddings():
  """objectives/albert.py's `validate` hook runs in config_checks."""
  from bert_jax.training import config_checks
  c = family_checks.family_config("albert")
  config_checks.validate(c, 1, check_sources=False)
  c.model.embedding_size = 0
  with pytest.raises(ValueError, match="ALBERT factorizes its embeddings"):
    config_checks.validate(c, 1, check_sources=False)
