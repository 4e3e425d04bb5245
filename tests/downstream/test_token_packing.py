"""Token tagging on packed rows (data.packing): each sentence as if alone.

Sentences of NER-like lengths (some past a window; ModernBERT's local
layers see a window shorter than most) run one a row (padded) and several
a row (packed by ``data/feature_packing.py``): per sentence, the tag logits
the token kind predicts equal those it gets alone, and the loss and its
gradients on the packed batch equal the padded batch's, for BERT and
ModernBERT with every attention kind that runs here. Changing the first
sentence of each row leaves the others' logits bit for bit unchanged.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import tasks
from bert_jax.data import feature_batches
from bert_jax.data import feature_packing
from bert_jax.training import steps as steps_lib
from tests.helpers import family_checks

SEQ, HEADS, HEAD_DIM, VOCAB, LABELS, S = 128, 2, 64, 97, 5, 4
LENGTHS = (37, 50, 30, 60, 45, 20, 9, 3, 14)
IMPLS = ("xla", "dot_product_attention", "splash")


def _config(family: str, impl: str, packing: bool):
  config = config_lib.get_config("tiny")
  config.objective.update(name=tasks.get("token").objective, encoder=family)
  config.model.update(vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM,
                      num_attention_heads=HEADS, intermediate_size=256,
                      num_hidden_layers=2, max_position_embeddings=SEQ,
                      num_labels=LABELS, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, attention_impl=impl,
                      splash_interpret=True)
  if family == "modernbert":  # Global, local, local; a 16-token window.
    config.model.update(family_checks.MODERNBERT_TINY, local_attention=16)
  config.data.update(seq_length=SEQ, packing=packing,
                     packing_max_sequences=S)
  return config


def _features() -> feature_batches.Features:
  """[CLS] tokens [SEP] windows with a tag and a weight per token (0 at the
  specials and at some later sub-tokens)."""
  r = np.random.RandomState(0)
  n = len(LENGTHS)
  real = np.arange(SEQ)[None] < np.asarray(LENGTHS)[:, None]
  ids = np.where(real, r.randint(5, VOCAB, (n, SEQ)), 0)
  ids[:, 0] = 2
  ids[np.arange(n), np.asarray(LENGTHS) - 1] = 3
  inner = real & (ids > 3)
  return feature_batches.Features(
      ids.astype(np.int32), np.asarray(LENGTHS, np.int32),
      dict(labels=np.where(real, r.randint(0, LABELS, (n, SEQ)), 0).astype(
          np.int32),
           label_weights=(inner & (r.rand(n, SEQ) < 0.8)).astype(np.float32)))


def _batches():
  features = _features()
  shape = feature_packing.Shape(SEQ, S, window=64)
  rows = feature_packing.best_fit_decreasing(features.lengths, SEQ, S)
  packed = feature_packing.pack(features, rows, shape, pad_id=0)
  assert len(packed["input_ids"]) < len(LENGTHS) / 2
  padded = features.rows(np.arange(len(LENGTHS)), SEQ, pad_id=0)
  return padded, packed


def _runner(config, graphdef):
  objective = compose.objective(config)
  names = objective.feature_spec(config)

  def run(params, batch):
    batch = {k: batch[k] for k in names}
    loss, grads = jax.value_and_grad(lambda p: steps_lib.batch_loss(
        p, batch, graphdef=graphdef, config=config, objective=objective))(
            params)
    out = objective.predict(nnx.merge(graphdef, params), batch, config)
    return out["logits"], loss, grads

  return jax.jit(run)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", ["bert", "modernbert"])
def test_packed_sentences_get_the_tags_losses_and_gradients_of_each_alone(
    family, impl):
  padded, packed = _batches()
  pad_config = _config(family, impl, False)
  pack_config = _config(family, impl, True)
  model = compose.objective(pad_config).make_model(pad_config, nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  alone, loss_pad, grads_pad = _runner(pad_config, graphdef)(params, padded)
  run_packed = _runner(pack_config, graphdef)
  together, loss_pack, grads_pack = run_packed(params, packed)
  together, alone = np.asarray(together), np.asarray(alone)
  assert together.shape == (len(packed["input_ids"]), S, SEQ, LABELS)
  for r, s in zip(*np.nonzero(packed["example_weights"])):
    i = int(packed["example_index"][r, s])
    n = LENGTHS[i]
    np.testing.assert_allclose(together[r, s, :n], alone[i, :n], atol=1e-5,
                               rtol=0, err_msg=str(i))
    assert not together[r, s, n:].any()
  assert not together[packed["example_weights"] == 0].any()
  # The same labelled tokens, the same sums and counts: the same loss and
  # gradients.
  np.testing.assert_allclose(loss_pack, loss_pad, rtol=1e-6)
  for (path, a), (_, b) in zip(
      jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads_pack)),
      jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(grads_pad))):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5,
                               err_msg=jax.tree_util.keystr(path))
  # Another first sentence in each row changes none of the others' tags.
  changed = dict(packed)
  first = packed["sequence_ids"] == 1
  changed["input_ids"] = np.where(first, (packed["input_ids"] + 7) % VOCAB,
                                  packed["input_ids"])
  other = np.asarray(run_packed(params, changed)[0])
  np.testing.assert_array_equal(other[:, 1:], together[:, 1:])
  assert not np.allclose(other[:, 0], together[:, 0])
