"""ModernBERT and Hugging Face (bert_jax/families/modernbert.py): our export
loads in stock transformers with our logits (fp32, 1e-4; rows longer than
the sliding window, padded rows, both attention implementations), a
directory made by transformers' own random init imports with its logits and
hidden states, classifiers (sequence, token, QA) go both ways,
config.json converts both ways
(and is refused where we would compute another function), and fill-mask
gives the pipeline's answer."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import pretrained
from bert_jax import tasks
from bert_jax.families import modernbert as modernbert_family
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from tests.helpers import family_checks
from tests.helpers import tiny_models
from tests.helpers import torch_reference

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

T = 40  # Longer than the 8-token window: the window matters (blocked too).
LENGTHS = (40, 27, 9, 1)


def model_config(**fields):
  config = family_checks.family_config("modernbert").model
  config.update(fields)
  return config


def batch(vocab, seed=0):
  r = np.random.RandomState(seed)
  mask = (np.arange(T)[None] < np.asarray(LENGTHS)[:, None]).astype(np.int32)
  return (r.randint(5, vocab, (len(LENGTHS), T)) * mask).astype(np.int32), mask


@pytest.fixture(autouse=True, scope="module")
def torch_one_thread():
  with torch_reference.one_thread():
    yield


# Our tables by name: the masked LM, and each task kind's head on
# ModernBERT's encoder.
TABLES = {"modernbert": modernbert_family.MODERNBERT,
          "modernbert_classify": compose.task_table("modernbert", "sentence"),
          "modernbert_token_classify": compose.task_table("modernbert",
                                                          "token"),
          "modernbert_qa": compose.task_table("modernbert", "span")}


def fresh_params(config, family="modernbert", seed=0):
  """The table's model's init as a nested dict (jitted: eager init op by
  op is slow)."""
  make = TABLES[family].make_model
  return jax.device_get(jax.jit(lambda: nnx.to_pure_dict(nnx.state(
      make(config, nnx.Rngs(seed)), nnx.Param)))())


def random_params(config, family="modernbert", scale=0.3, seed=0):
  """Fresh params with every tensor redrawn at `scale` (norm scales around
  1): init-sized weights would make near-zero logits that hide errors."""
  flat = mapping.flatten_params(fresh_params(config, family, seed))
  r = np.random.RandomState(seed)
  out = {}
  for k, v in flat.items():
    x = r.normal(0, scale, v.shape).astype(np.float32)
    out[k] = 1.0 + x if k.endswith("norm.scale") else x
  return mapping.unflatten_params(out)


def our_outputs(params, config, ids, mask, family="modernbert"):
  model = mapping.make_model(params, config, TABLES[family])
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, i, m: nnx.merge(graphdef, s)(i, m))
  out = fn(state, ids, mask)
  return jax.tree.map(np.asarray, out)


def hf_model(cls, path, attn="eager"):
  return cls.from_pretrained(path, attn_implementation=attn,
                             dtype=torch.float32).eval()


def real(x, mask):
  return x[mask.astype(bool)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  base = str(tmp_path_factory.mktemp("modernbert_hf"))
  config = model_config()
  params = random_params(config)
  out = os.path.join(base, "mlm")
  checkpoint_io.save_hf_model(out, params, config, table=modernbert_family.MODERNBERT)
  return dict(base=base, config=config, params=params, out=out)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_export_gives_our_logits_in_pytorch(exported, attn):
  config, params = exported["config"], exported["params"]
  ids, mask = batch(config.vocab_size)
  ours = our_outputs(params, config, ids, mask)["mlm_logits"]
  model = hf_model(transformers.ModernBertForMaskedLM, exported["out"], attn)
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long(),
                   attention_mask=torch.tensor(mask).long()).logits.numpy()
  assert np.abs(theirs).max() > 1.0  # Not a trivially small comparison.
  np.testing.assert_allclose(real(ours, mask), real(theirs, mask), atol=1e-4,
                             rtol=1e-4)


@pytest.mark.parametrize("config", [
    dict(hidden_size=64, num_attention_heads=2),  # head size 32
    dict(hidden_size=64, num_attention_heads=4),  # head size 16
    {},  # ModernBERT-base: head size 64
])
def test_rotary_tables_are_hugging_faces(config):
  """Our inverse frequencies, bit for bit, are transformers' buffers (full
  and sliding layers' bases)."""
  from bert_jax.models import rotary
  hf = transformers.ModernBertConfig(**config)
  emb = transformers.models.modernbert.modeling_modernbert.\
      ModernBertRotaryEmbedding(hf)
  head = hf.hidden_size // hf.num_attention_heads
  for layer_type in ("full_attention", "sliding_attention"):
    theta = hf.rope_parameters[layer_type]["rope_theta"]
    theirs = getattr(emb, f"{layer_type}_inv_freq").numpy()
    np.testing.assert_array_equal(rotary.inverse_frequencies(head, theta),
                                  theirs)


def test_export_gives_our_logits_at_4096_tokens(tmp_path):
  """Rotary angles grow with the position: a table off in the last place
  shows at thousands of tokens (and, through the global layers' attention,
  at every position). One 4,096-token row, head size 32, weights at 0.2
  (at 0.3 float32 noise alone reaches the tolerance over 4,096 keys), at
  the tolerance of the short rows above."""
  T4 = 4096
  config = model_config(max_position_embeddings=T4, num_attention_heads=2)
  params = random_params(config, scale=0.2, seed=1)
  out = str(tmp_path / "long")
  checkpoint_io.save_hf_model(out, params, config,
                              table=modernbert_family.MODERNBERT)
  r = np.random.RandomState(2)
  mask = np.ones((1, T4), np.int32)
  ids = r.randint(5, config.vocab_size, (1, T4)).astype(np.int32)
  ours = our_outputs(params, config, ids, mask)["mlm_logits"]
  model = hf_model(transformers.ModernBertForMaskedLM, out, "sdpa")
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long(),
                   attention_mask=torch.tensor(mask).long()).logits.numpy()
  assert np.abs(theirs).max() > 1.0
  np.testing.assert_allclose(real(ours, mask), real(theirs, mask), atol=1e-4,
                             rtol=1e-4)


def test_config_json_is_hugging_faces_and_reads_back(exported):
  with open(os.path.join(exported["out"], "config.json")) as f:
    cfg = json.load(f)
  hf = transformers.ModernBertConfig.from_pretrained(exported["out"])
  assert hf.layer_types == ["full_attention", "sliding_attention",
                            "sliding_attention"]
  assert hf.sliding_window == 4 and cfg["local_attention"] == 8
  assert hf.rope_parameters["full_attention"]["rope_theta"] == 160_000.0
  assert hf.rope_parameters["sliding_attention"]["rope_theta"] == 10_000.0
  back = modernbert_family.config_from_hf(cfg)
  for field in ("vocab_size", "hidden_size", "num_hidden_layers",
                "intermediate_size", "local_attention",
                "global_attn_every_n_layers", "global_rope_theta",
                "local_rope_theta", "layer_norm_eps", "hidden_act"):
    assert back[field] == exported["config"][field], field
  # Hub configs from before layer_types / rope_parameters read the same.
  old = {k: v for k, v in cfg.items()
         if k not in ("layer_types", "rope_parameters")}
  old.update(global_rope_theta=160_000.0, local_rope_theta=10_000.0,
             global_attn_every_n_layers=3)
  assert modernbert_family.config_from_hf(old).to_dict() == back.to_dict()


@pytest.mark.parametrize("change, message", [
    (dict(norm_bias=True), "norm_bias=True: this ModernBERT implements "
     "norm_bias=False only"),
    (dict(layer_types=["full_attention", "full_attention",
                       "sliding_attention"]), "layer_types="),
    (dict(rope_parameters={"full_attention": {"rope_type": "yarn"}}),
     "rope_type='yarn'"),
    (dict(classifier_activation="silu"), "classifier_activation='silu'"),
])
def test_configs_we_would_compute_wrong_are_refused(exported, change,
                                                    message):
  with open(os.path.join(exported["out"], "config.json")) as f:
    cfg = dict(json.load(f), **change)
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    modernbert_family.config_from_hf(cfg)


def test_import_of_transformers_random_init(tmp_path):
  """ModernBertForMaskedLM as transformers initializes it (its own
  truncated normals, tied decoder omitted or written) -> our tree, our
  logits equal its; a bare ModernBertModel imports with a fresh head
  (reported) and the same last hidden state."""
  cfg = transformers.ModernBertConfig(
      vocab_size=200, hidden_size=64, intermediate_size=96,
      num_hidden_layers=4, num_attention_heads=4, local_attention=8,
      global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2,
      eos_token_id=3, cls_token_id=2, sep_token_id=3,
      max_position_embeddings=128)
  torch.manual_seed(0)
  theirs = transformers.ModernBertForMaskedLM(cfg).eval()
  path = str(tmp_path / "hf_mlm")
  theirs.save_pretrained(path)
  ids, mask = batch(200, seed=1)
  source = pretrained.resolve(path)
  assert source.table is TABLES["modernbert"]
  config = pretrained.load_model_config(source)
  assert (config.global_attn_every_n_layers, config.local_attention) == (2, 8)
  params, report = pretrained.load_params(source, config)
  assert report.architecture == "ModernBertForMaskedLM" and not report.fresh
  ours = our_outputs(params, config, ids, mask)
  with torch.no_grad():
    want = theirs(input_ids=torch.tensor(ids).long(),
                  attention_mask=torch.tensor(mask).long())
  np.testing.assert_allclose(real(ours["mlm_logits"], mask),
                             real(want.logits.numpy(), mask), atol=1e-4)
  bare = str(tmp_path / "hf_model")
  theirs.model.save_pretrained(bare)
  params, report = pretrained.load_params(pretrained.resolve(bare), config)
  assert report.fresh == ["decoder", "head"]
  hidden = our_outputs(params, config, ids, mask)["sequence_output"]
  with torch.no_grad():
    want = theirs.model(input_ids=torch.tensor(ids).long(),
                        attention_mask=torch.tensor(mask).long())
  np.testing.assert_allclose(real(hidden, mask),
                             real(want.last_hidden_state.numpy(), mask),
                             atol=1e-4)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_sequence_classifier_goes_both_ways(tmp_path, pooling):
  config = model_config(num_labels=3, classifier_pooling=pooling)
  params = random_params(config, "modernbert_classify")
  out = str(tmp_path / "cls")
  checkpoint_io.save_hf_model(out, params, config,
                              label_names=("a", "b", "c"), table=compose.task_table("modernbert", "sentence"))
  model = hf_model(transformers.ModernBertForSequenceClassification, out)
  assert model.config.id2label == {0: "a", 1: "b", 2: "c"}
  ids, mask = batch(config.vocab_size)
  ours = our_outputs(params, config, ids, mask, "modernbert_classify")
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long(),
                   attention_mask=torch.tensor(mask).long()).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
  source = pretrained.resolve(out)
  assert source.table is TABLES["modernbert_classify"]
  back, _ = pretrained.load_params(source)
  for k, v in mapping.flatten_params(params).items():
    np.testing.assert_array_equal(mapping.flatten_params(back)[k], v)


# Our per-token heads: (table, transformers class, the logits to compare).
PER_TOKEN = {
    "token": ("modernbert_token_classify", "ModernBertForTokenClassification",
              lambda out: {"logits": out}),
    "span": ("modernbert_qa", "ModernBertForQuestionAnswering",
             lambda out: {"start_logits": out[..., 0],
                          "end_logits": out[..., 1]}),
}


def _transformers_config(**fields):
  """A tiny ModernBertConfig: 4 blocks, full attention every 2nd, an
  8-token window (the rows of `batch` are longer)."""
  return transformers.ModernBertConfig(
      vocab_size=200, hidden_size=64, intermediate_size=96,
      num_hidden_layers=4, num_attention_heads=4, local_attention=8,
      global_attn_every_n_layers=2, pad_token_id=0, bos_token_id=2,
      eos_token_id=3, cls_token_id=2, sep_token_id=3,
      max_position_embeddings=128, **fields)


def _their_logits(model, ids, mask) -> dict:
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids).long(),
                attention_mask=torch.tensor(mask).long())
  return {k: out[k].numpy() for k in ("logits", "start_logits", "end_logits")
          if k in out}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["token", "span"])
def test_per_token_head_of_transformers_random_init_goes_both_ways(
    tmp_path, kind):
  """ModernBertForTokenClassification / ForQuestionAnswering as
  transformers initializes them -> our import (that class's table and
  objective) -> our logits equal theirs on padded rows longer than the
  window; our export of those params loads in the same class with no
  missing or unexpected keys and gives our logits again."""
  family, cls_name, named = PER_TOKEN[kind]
  cls = getattr(transformers, cls_name)
  labels = dict(num_labels=5) if kind == "token" else {}
  torch.manual_seed(0)
  theirs = cls(_transformers_config(**labels)).eval()
  path = str(tmp_path / "theirs")
  theirs.save_pretrained(path)
  source = pretrained.resolve(path)
  assert source.table is TABLES[family]
  assert (source.objective, source.config.objective.encoder) == (
      {"token": "token_classify", "span": "span_qa"}[kind], "modernbert")
  config = pretrained.load_model_config(source)
  params, report = pretrained.load_params(source, config)
  assert report.architecture == cls_name and not report.fresh, report
  ids, mask = batch(200, seed=2)
  ours = named(our_outputs(params, config, ids, mask, family))
  want = _their_logits(theirs, ids, mask)
  assert set(ours) == set(want)
  for name, x in ours.items():
    assert x.shape == want[name].shape, name
    assert np.abs(want[name]).max() > 0.5, name  # Not trivially small.
    print(f"{kind} {name}: max |ours - PyTorch| = "
          f"{np.abs(real(x, mask) - real(want[name], mask)).max():.2g} at "
          f"max |logit| {np.abs(want[name]).max():.2g}")
    np.testing.assert_allclose(real(x, mask), real(want[name], mask),
                               atol=1e-4, rtol=1e-4, err_msg=name)
  out = str(tmp_path / "ours")
  checkpoint_io.save_hf_model(out, params, config, table=TABLES[family])
  back, info = cls.from_pretrained(out, attn_implementation="eager",
                                   dtype=torch.float32,
                                   output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys")), info
  assert back.config.num_labels == (5 if kind == "token" else 2)
  again = _their_logits(back.eval(), ids, mask)
  for name, x in ours.items():
    np.testing.assert_allclose(real(x, mask), real(again[name], mask),
                               atol=1e-4, rtol=1e-4, err_msg=name)


@pytest.mark.parametrize("kind", ["token", "span"])
def test_per_token_head_from_a_masked_lm_keeps_its_head(tmp_path, kind):
  """A ModernBertForMaskedLM directory read by a per-token head's table:
  the encoder and the prediction head load (as HF's from_pretrained of
  that class does), the classifier alone is fresh."""
  family = PER_TOKEN[kind][0]
  torch.manual_seed(0)
  mlm = transformers.ModernBertForMaskedLM(_transformers_config()).eval()
  path = str(tmp_path / "mlm")
  mlm.save_pretrained(path)
  config = pretrained.load_model_config(pretrained.resolve(path))
  config.num_labels = 3
  params, report = checkpoint_io.load_hf_params(path, config, TABLES[family])
  assert report.fresh == [tasks.get(kind).output_name], report
  want = {k: v.detach().numpy() for k, v in mlm.state_dict().items()}
  got = mapping.to_hf_state_dict(params, TABLES[family])
  for name in ("head.dense.weight", "head.norm.weight",
               "model.layers.1.attn.Wqkv.weight"):
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  outputs = 3 if kind == "token" else 2
  assert got["classifier.weight"].shape == (outputs, 64)


def test_fill_mask_equals_the_pipeline(tmp_path):
  """Our fill_mask on an export with a WordPiece tokenizer gives
  transformers' pipeline("fill-mask") tokens and scores."""
  from bert_jax.downstream import mask_filling
  from bert_jax.hf import tokenizer_files
  vocab_path = str(tmp_path / "vocab.txt")
  vocab = tiny_models.write_vocab(vocab_path)
  config = model_config(vocab_size=len(vocab))
  params = random_params(config)
  out = str(tmp_path / "hf")
  checkpoint_io.save_hf_model(out, params, config,
      tokenizer=tokenizer_files.TokenizerSpec("wordpiece", vocab_path, True), table=modernbert_family.MODERNBERT)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert [cfg[k] for k in ("pad_token_id", "cls_token_id", "sep_token_id")
          ] == [vocab.index(t) for t in ("[PAD]", "[CLS]", "[SEP]")]
  text = "the movie was [MASK] and the story was long ."
  theirs = transformers.pipeline("fill-mask", model=out, top_k=3)(text)
  ours = mask_filling.fill_mask(out, text, top_k=3)
  assert [r["token_str"] for r in ours] == [r["token_str"] for r in theirs]
  np.testing.assert_allclose([r["score"] for r in ours],
                             [r["score"] for r in theirs], rtol=1e-4)


def test_fresh_initialization_is_transformers():
  """Our init draws every tensor as HF's ``_init_weights`` does: the same
  std per tensor (truncated normals: embeddings, Wqkv, Wi at
  initializer_range; both output projections and the head's dense at
  initializer_range / sqrt(2 L); a classifier at hidden**-0.5), cut at 2
  std, norms 1, biases 0. Tensors of 16k+ samples: std within 3%."""
  config = model_config(vocab_size=1024, hidden_size=128,
                        num_attention_heads=2, intermediate_size=192,
                        num_labels=128)
  cfg = transformers.ModernBertConfig(num_labels=128, **{
      k: v for k, v in modernbert_family.config_to_hf(config).items()
      if k not in ("architectures", "model_type", "dtype")})
  for family, cls in (("modernbert", transformers.ModernBertForMaskedLM),
                      ("modernbert_classify",
                       transformers.ModernBertForSequenceClassification)):
    torch.manual_seed(0)
    theirs = {k: v.detach().numpy()
              for k, v in cls(cfg).state_dict().items()}
    ours = mapping.to_hf_state_dict(fresh_params(config, family), TABLES[family])
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for name, x in ours.items():
      y = theirs[name]
      if np.all(y == y.flat[0]):  # Norm scales and biases: constants.
        np.testing.assert_array_equal(x, y, err_msg=name)
        continue
      assert x.std() == pytest.approx(y.std(), rel=0.03), name
      # Cut at 2 std of the untruncated normal, whose std is the truncated
      # one's / 0.8796 (cut at +-2): both reach close to the cut, not past.
      cut = 2.0 * y.std() / 0.8796
      for z in (x, y):
        assert 0.9 * cut < np.abs(z).max() < 1.02 * cut, name
