"""The BERT architecture: sizes, shapes, dtypes, tying and numerics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.models import albert
from bert_jax.models import bert as bert_model
from tests import helpers


def tiny_config(**overrides):
  """The shared tiny model config with vocab 211 (odd: catches padding)."""
  return helpers.tiny_config(model=dict(vocab_size=211) | overrides).model


def count(config):
  abstract = nnx.eval_shape(
      lambda: bert_model.BertForPreTraining(config, rngs=nnx.Rngs(0)))
  return bert_model.count_params(abstract)


# Turc et al. 2019 (tiny..medium) and Devlin et al. 2019 (base, large):
# (layers, hidden); heads of 64, FFN 4x hidden. Published BertForPreTraining
# parameter counts (bert-base-uncased / bert-large-uncased on the HF hub).
PUBLISHED_SHAPES = {"tiny": (2, 128), "mini": (4, 256), "small": (4, 512),
                    "medium": (8, 512), "base": (12, 768), "large": (24, 1024)}
PUBLISHED_COUNTS = {"base": 110_106_428, "large": 336_226_108}


def _config_file(name: str):
  """configs/NAME.py loaded by path and its get_config() called, as
  `--config configs/NAME.py` does."""
  import importlib.util
  import os
  path = os.path.join(helpers.REPO, "configs", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"config_file_{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def _hugging_face_count(m) -> int:
  """Parameters of transformers' own BertForPreTraining of these dimensions
  (an independent implementation; the tied decoder counted once). Built on
  the meta device: shapes only, no memory, no init."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  hf_config = transformers.BertConfig(
      vocab_size=m.vocab_size, hidden_size=m.hidden_size,
      num_hidden_layers=m.num_hidden_layers,
      num_attention_heads=m.num_attention_heads,
      intermediate_size=m.intermediate_size,
      max_position_embeddings=m.max_position_embeddings,
      type_vocab_size=m.type_vocab_size)
  with torch.device("meta"):
    model = transformers.BertForPreTraining(hf_config)
  return sum(p.numel() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("size", list(PUBLISHED_SHAPES))
def test_config_files_are_the_published_sizes(size):
  m = _config_file(size).model
  layers, hidden = PUBLISHED_SHAPES[size]
  assert (m.num_hidden_layers, m.hidden_size, m.num_attention_heads,
          m.intermediate_size) == (layers, hidden, hidden // 64, 4 * hidden)
  ours = count(m)
  assert ours == _hugging_face_count(m)
  if size in PUBLISHED_COUNTS:
    assert ours == PUBLISHED_COUNTS[size]


def _inputs(batch=3, seq=16, vocab=211, seed=0):
  rng = np.random.RandomState(seed)
  ids = rng.randint(5, vocab, size=(batch, seq)).astype(np.int32)
  mask = np.ones((batch, seq), np.int32)
  mask[1, 10:] = 0
  segments = np.zeros((batch, seq), np.int32)
  segments[:, 8:] = 1
  return jnp.asarray(ids), jnp.asarray(mask), jnp.asarray(segments)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_forward_shapes_and_dtypes(dtype):
  config = tiny_config(dtype=dtype)
  model = bert_model.BertForPreTraining(config, rngs=nnx.Rngs(0))
  ids, mask, seg = _inputs()
  positions = jnp.asarray([[1, 2, 0], [3, 4, 5], [6, 0, 0]], jnp.int32)
  out = model(ids, mask, seg, positions)
  assert out["mlm_logits"].shape == (3, 3, 211)
  assert out["mlm_logits"].dtype == jnp.float32  # Loss math in fp32.
  assert out["nsp_logits"].shape == (3, 2)
  assert out["sequence_output"].shape == (3, 16, 64)
  assert out["sequence_output"].dtype == jnp.dtype(dtype)
  assert out["pooled_output"].shape == (3, 64)
  full = model(ids, mask, seg)["mlm_logits"]
  assert full.shape == (3, 16, 211)
  # Gathering before the head equals gathering the full-vocabulary logits.
  np.testing.assert_allclose(
      out["mlm_logits"], jnp.take_along_axis(full, positions[..., None], 1),
      rtol=1e-5, atol=1e-5 if dtype == "float32" else 3e-2)


def test_params_are_float32_in_bf16_compute():
  model = bert_model.BertForPreTraining(tiny_config(dtype="bfloat16"),
                                       rngs=nnx.Rngs(0))
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert {x.dtype for x in leaves} == {jnp.dtype("float32")}


def test_mlm_decoder_is_tied_to_word_embeddings():
  config = tiny_config()
  model = bert_model.BertForPreTraining(config, rngs=nnx.Rngs(0))
  ids, mask, seg = _inputs()
  before = model(ids, mask, seg)["mlm_logits"]
  emb = model.bert.embeddings.word_embeddings
  emb[...] = emb[...].at[7].add(1.0)  # Touch one output row only via the table.
  after = model(ids, mask, seg)["mlm_logits"]
  changed = np.abs(np.asarray(after - before)).max(axis=(0, 1)) > 1e-6
  assert changed[7]
  # No separate decoder matrix: the only vocab-sized params are the table
  # and the output bias.
  vocab_params = [p for p in jax.tree.leaves(nnx.state(model, nnx.Param))
                  if config.vocab_size in p.shape]
  assert sorted(p.shape for p in vocab_params) == [(211,), (211, 64)]


def test_padding_is_ignored_and_fully_padded_rows_stay_finite_in_bf16():
  config = tiny_config(dtype="bfloat16")
  model = bert_model.BertForPreTraining(config, rngs=nnx.Rngs(0))
  ids, mask, seg = _inputs()
  out = model(ids, mask, seg)
  # Changing tokens under padding does not change unpadded outputs.
  ids2 = ids.at[1, 12:].set(9)
  out2 = model(ids2, mask, seg)
  np.testing.assert_array_equal(out["sequence_output"][1, :10],
                                out2["sequence_output"][1, :10])
  all_pad = jnp.zeros_like(mask)
  out3 = model(ids, all_pad, seg)
  for k in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
    assert bool(jnp.all(jnp.isfinite(out3[k].astype(jnp.float32)))), k


def test_dropout_is_active_only_in_training():
  config = tiny_config()
  model = bert_model.BertForPreTraining(config, rngs=nnx.Rngs(0))
  ids, mask, seg = _inputs()
  a = model(ids, mask, seg)["sequence_output"]
  b = model(ids, mask, seg)["sequence_output"]
  np.testing.assert_array_equal(a, b)
  c = model(ids, mask, seg, deterministic=False,
            rngs=nnx.Rngs(dropout=1))["sequence_output"]
  assert not np.allclose(a, c)


@pytest.mark.parametrize("field,value,message", [
    ("num_attention_heads", 5, "num_attention_heads=5"),
    ("hidden_act", "relu", "hidden_act"),
])
def test_bad_model_config_names_the_field(field, value, message):
  config = tiny_config(**{field: value})
  with pytest.raises(ValueError, match=message):
    bert_model.BertForPreTraining(config, rngs=nnx.Rngs(0))


def test_fused_attention_mask_is_finite_in_float16():
  """-1e9 is -inf in float16; the fused path must clamp it (no NaN rows)."""
  config = tiny_config(dtype="float16", attention_impl="dot_product_attention")
  model = bert_model.BertForPreTraining(config, rngs=nnx.Rngs(0))
  ids, _, seg = _inputs()
  out = model(ids, jnp.zeros_like(ids), seg)
  for k in ("sequence_output", "pooled_output", "mlm_logits", "nsp_logits"):
    assert bool(jnp.all(jnp.isfinite(out[k].astype(jnp.float32)))), k


def test_factorized_embeddings_have_one_projection_everywhere():
  """E != H: ELECTRA's encoder, a fine-tuned ELECTRA/ALBERT BertModel and
  ALBERT project E -> H with the same module (same parameter names, the
  activation layout constraint on all three); E == H: no projection."""
  config = helpers.tiny_config(model=dict(embedding_size=16)).model
  rngs = nnx.Rngs(0)
  built = [bert_model.Encoder(config, rngs=rngs),
           bert_model.BertModel(config, rngs=rngs),
           albert.AlbertModel(config, rngs=rngs)]
  for model in built:
    project = model.embeddings_project
    assert isinstance(project, bert_model.EmbeddingsProjection), type(model)
    assert project.kernel.shape == (16, config.hidden_size)
    assert sorted(k for k, _ in nnx.to_flat_state(nnx.state(project))) == [
        ("bias",), ("kernel",)]
  x = jnp.ones((2, 4, 16))
  np.testing.assert_allclose(  # A plain dense: x W + b.
      built[0].embeddings_project(x),
      x @ built[0].embeddings_project.kernel[...]
      + built[0].embeddings_project.bias[...], rtol=1e-5)
  plain = helpers.tiny_config().model
  assert bert_model.embeddings_projection(plain, rngs) is None
