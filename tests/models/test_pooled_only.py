"""A sentence head's encoder computes its last layer at [CLS] alone
(``BertModel(pooled_only=True)``, what every BERT-style ``TaskModel`` with
a pooler asks for): the pooled output and its gradients equal the whole
stack's, on padded and packed rows, with remat and fused QKV, whatever the
attention kind; the compiled step does less work."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax.models import bert as bert_model
from tests import helpers
from tests.helpers import packed_rows

VOCAB, SEQ, LAYERS = 97, 128, 3  # Splash takes multiples of 128.
# Two packed rows of up to 4 sequences (the second row's last slot empty).
LENGTHS = (12, 20, 9, 17, 25, 14, 6)
MAX_SEQUENCES = 4


def _config(**model):
  fields = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4,
                intermediate_size=128, num_hidden_layers=LAYERS,
                max_position_embeddings=SEQ, splash_interpret=True,
                **helpers.NO_DROPOUT)
  fields.update(model)
  return helpers.tiny_config(model=fields).model


def _batches():
  exs = packed_rows.examples(0, LENGTHS, 1, VOCAB)
  padded = packed_rows.padded(exs, SEQ, 1)
  packed, _ = packed_rows.packed(exs, SEQ, 4, MAX_SEQUENCES)
  packed_keys = dict(sequence_ids=packed["sequence_ids"],
                     position_ids=packed["position_ids"],
                     cls_positions=packed["cls_positions"])
  return dict(padded=(padded, {}), packed=(packed, packed_keys))


def _pooled_and_grads(config, batch, extra, pooled_only: bool):
  model = bert_model.BertModel(config, rngs=nnx.Rngs(0))
  nnx.update(model, helpers.noised_params(model))
  graphdef, params = nnx.split(model, nnx.Param)
  weights = np.random.RandomState(3).normal(
      size=(config.hidden_size,)).astype(np.float32)

  def pooled(p):
    m = nnx.merge(graphdef, p)
    return m(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
             pooled_only=pooled_only, **extra)[1]

  out = pooled(params)
  grads = jax.grad(lambda p: jnp.sum(jnp.tanh(pooled(p) @ weights)))(params)
  return out, nnx.to_pure_dict(grads)


def _variant(name, slow=True, **model):
  return pytest.param(model, id=name,
                      marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize("rows", ["padded", "packed"])
@pytest.mark.parametrize("model", [
    _variant("xla", slow=False), _variant("remat", remat_policy="full"),
    _variant("fused_qkv", fused_qkv=True),
    _variant("dpa", attention_impl="dot_product_attention"),
    _variant("splash", attention_impl="splash"),
    # ELECTRA / ALBERT: the E -> H projection.
    _variant("factorized", embedding_size=32),
    # DistilBERT's layout: no segment table, a ReLU pre-classifier.
    _variant("no_segments", pooler_act="relu", type_vocab_size=0)])
def test_pooled_output_and_gradients_equal_the_whole_stack(rows, model):
  batch, extra = _batches()[rows]
  config = _config(**model)
  want, want_grads = _pooled_and_grads(config, batch, extra, False)
  got, got_grads = _pooled_and_grads(config, batch, extra, True)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)
  leaves = jax.tree_util.tree_leaves_with_path(want_grads)
  for (path, a), (_, b) in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                               leaves, strict=True):
    # Sums over every token in another order: float32 noise up to ~1e-5.
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-4,
                               err_msg=jax.tree_util.keystr(path))


def test_last_layer_states_are_at_cls_only():
  batch, extra = _batches()["packed"]
  model = bert_model.BertModel(_config(), rngs=nnx.Rngs(0))
  seq, _ = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                 pooled_only=True, **extra)
  full, _ = model(batch["input_ids"], batch["input_mask"],
                  batch["segment_ids"], **extra)
  assert seq.shape == (len(batch["input_ids"]), MAX_SEQUENCES, 64)
  np.testing.assert_allclose(
      seq, np.take_along_axis(np.asarray(full),
                              batch["cls_positions"][..., None], axis=1),
      atol=2e-6, rtol=0)


def test_compiled_step_computes_one_layer_less_per_token():
  """XLA's count of the gradient's FLOPs drops by most of one layer's
  per-token work (all but its keys and values)."""
  batch, _ = _batches()["padded"]
  config = _config()

  def flops(pooled_only):
    model = bert_model.BertModel(config, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model, nnx.Param)

    def loss(p):
      m = nnx.merge(graphdef, p)
      return jnp.sum(m(batch["input_ids"], batch["input_mask"],
                       batch["segment_ids"], pooled_only=pooled_only)[1])

    return jax.jit(jax.grad(loss)).lower(params).compile().cost_analysis()[
        "flops"]

  full, only = flops(False), flops(True)
  d, f, tokens = 64, 128, batch["input_ids"].size
  # Forward + backward of one layer's queries, output and feed-forward.
  saved = 6.0 * tokens * (2 * d * d + 2 * d * f)
  assert full - only > 0.8 * saved, (full, only, saved)


def test_pooled_only_needs_the_pooler():
  model = bert_model.BertModel(_config(), rngs=nnx.Rngs(0),
                               add_pooling_layer=False)
  batch, _ = _batches()["padded"]
  with pytest.raises(ValueError, match="pooled_only needs the pooler"):
    model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
          pooled_only=True)
