"""Packed rows: every attention kind keeps each example to itself.

The same pretraining examples run one a row (padded) and several a row
(packed, tests/helpers/packed_rows.py): per example, the encoder outputs,
the pair logits at its own [CLS] and the MLM logits agree within 1e-5; the
BERT loss on the packed batch equals the loss on the padded one (the same
sums over the same examples), and so do its gradients. No attention crosses
an example's boundary: the mask the encoder builds is block-diagonal, and
changing one example leaves the others' outputs bit for bit unchanged.
ModernBERT (RoPE, sliding-window layers) passes the same checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from bert_jax import families
from bert_jax.data import features
from bert_jax.models import attention as attention_lib
from bert_jax.training import steps as steps_lib
from tests import helpers
from tests.helpers import family_checks
from tests.helpers import packed_rows

SEQ, HEADS, HEAD_DIM, VOCAB = 128, 2, 64, 211
# Two packed rows: 37 + 50 + 30 = 117 and 60 + 45 + 20 = 125 of 128 slots.
LENGTHS = (37, 50, 30, 60, 45, 20)
PREDS, MAX_SEQUENCES = 4, 4  # Per example; per packed row (P = 3 x 4).
KINDS = ("xla", "dot_product_attention", "splash")


def _config(impl: str, packing: bool):
  return helpers.tiny_config(
      model=dict(vocab_size=VOCAB, hidden_size=HEADS * HEAD_DIM,
                 num_attention_heads=HEADS, intermediate_size=256,
                 max_position_embeddings=SEQ, num_hidden_layers=1,
                 attention_impl=impl, splash_interpret=True,
                 **helpers.NO_DROPOUT),
      data=dict(seq_length=SEQ, packing=packing,
                packing_max_sequences=MAX_SEQUENCES,
                max_predictions_per_seq=3 * PREDS if packing else PREDS))


@pytest.fixture(scope="module")
def layouts():
  exs = packed_rows.examples(0, LENGTHS, PREDS, VOCAB)
  padded = packed_rows.padded(exs, SEQ, PREDS)
  packed, where = packed_rows.packed(exs, SEQ, 3 * PREDS, MAX_SEQUENCES)
  assert len(packed["input_ids"]) == 2
  return exs, padded, packed, where


def _outputs(model, batch):
  keys = ("sequence_ids", "position_ids", "cls_positions")
  out = model(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
              batch["masked_lm_positions"],
              **{k: batch[k] for k in keys if k in batch})
  return {k: out[k] for k in ("sequence_output", "nsp_logits", "mlm_logits")}


def _run(config, graphdef):
  """(params, batch) -> (outputs, loss, gradients), one compile per shape."""
  objective = families.objective("bert")

  def run(params, batch):
    loss, grads = jax.value_and_grad(lambda p: steps_lib.batch_loss(
        p, batch, graphdef=graphdef, config=config, objective=objective))(
            params)
    return _outputs(nnx.merge(graphdef, params), batch), loss, grads

  return jax.jit(run)


@pytest.mark.slow
@pytest.mark.parametrize("impl", KINDS)
def test_packed_rows_equal_each_example_alone(impl, layouts):
  exs, padded, packed, where = layouts
  pad_config, pack_config = _config(impl, False), _config(impl, True)
  model = families.objective("bert").make_model(pad_config, nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  alone, loss_pad, grads_pad = _run(pad_config, graphdef)(params, padded)
  run_packed = _run(pack_config, graphdef)
  together, loss_pack, grads_pack = run_packed(params, packed)
  slot = 0
  for i, (ex, (row, start)) in enumerate(zip(exs, where)):
    n, k = len(ex["input_ids"]), len(ex["positions"])
    slot = 0 if start == 0 else slot + 1
    np.testing.assert_allclose(
        together["sequence_output"][row, start:start + n],
        alone["sequence_output"][i, :n], atol=1e-5, rtol=0, err_msg=str(i))
    np.testing.assert_allclose(together["nsp_logits"][row, slot],
                               alone["nsp_logits"][i], atol=1e-5, rtol=0)
    p = np.flatnonzero(packed["masked_lm_positions"][row] >= start)
    p = p[np.isin(packed["masked_lm_positions"][row, p],
                  ex["positions"] + start)]
    np.testing.assert_allclose(together["mlm_logits"][row, p],
                               alone["mlm_logits"][i, :k], atol=1e-5, rtol=0)

  # The loss of the packed batch is the padded batch's (same examples, same
  # sums, same global counts), and so is its gradient.
  packed_rows.assert_same_loss_and_grads(loss_pack, grads_pack, loss_pad,
                                         grads_pad)

  # Another first example in each row changes nothing of the others'.
  changed = dict(packed)
  ids = packed["input_ids"].copy()
  first = packed["sequence_ids"] == 1
  ids[first] = (ids[first] + 7) % VOCAB
  changed["input_ids"] = ids
  other = run_packed(params, changed)[0]["sequence_output"]
  keep = ~first & (packed["input_mask"] > 0)
  np.testing.assert_array_equal(np.asarray(other)[keep],
                                np.asarray(together["sequence_output"])[keep])
  assert not np.allclose(np.asarray(other)[first],
                         np.asarray(together["sequence_output"])[first])


def test_mask_is_block_diagonal(layouts):
  """The mask the encoders build (attention.make_mask, as BertModel calls
  it) lets a query see exactly the keys of its own example."""
  exs, _, packed, where = layouts
  mask = attention_lib.make_mask(packed["input_mask"],
                                 packed["sequence_ids"])
  got = np.asarray(attention_lib.allowed(mask))[:, 0]  # [B, T, T]
  pad = packed["input_mask"] == 0
  want = pad[:, :, None] & pad[:, None, :]
  for ex, (row, start) in zip(exs, where):
    n = len(ex["input_ids"])
    want[row, start:start + n, start:start + n] = True
  np.testing.assert_array_equal(got, want)  # Padding attends padding only.
  # Padded rows: every query sees the real keys (BERT's key-padding mask).
  pad = attention_lib.allowed(attention_lib.make_mask(packed["input_mask"]))
  np.testing.assert_array_equal(
      np.asarray(pad)[:, 0, 0], packed["input_mask"] > 0)


def test_segment_positions_restart_in_each_example(layouts):
  _, _, packed, _ = layouts
  got = attention_lib.segment_positions(jnp.asarray(packed["sequence_ids"]))
  real = packed["input_mask"] > 0
  np.testing.assert_array_equal(np.asarray(got)[real],
                                packed["position_ids"][real])


def _modernbert_config(impl: str, packing: bool):
  """A 3-layer ModernBERT (global, local, local) with a 16-token window, so
  that 128-token rows run the blocked sliding window, and documents longer
  than the window."""
  config = _config(impl, packing)
  config.objective.name = "modernbert"
  config.model.update(family_checks.MODERNBERT_TINY, local_attention=16)
  config.data.update(nsp=False, objective="packed")
  return config


# On "xla" (the blocked sliding window): the other kinds on packed rows with
# a window ("dot_product_attention", splash's LocalMask with segment ids)
# equal "xla" at the attention level (tests/models/test_modernbert.py).
@pytest.mark.slow
def test_modernbert_packed_documents_equal_each_alone(layouts, impl="xla"):
  """ModernBERT on packed rows: each document gets the MLM logits it gets
  alone (RoPE positions and the sliding window restart per document, no
  key of another document is seen), and the packed batch's loss and
  gradients are the padded batch's; another first document changes none
  of the other documents' outputs."""
  exs, padded, packed, where = layouts
  pad_config = _modernbert_config(impl, False)
  pack_config = _modernbert_config(impl, True)
  objective = families.objective("modernbert")
  model = objective.make_model(pad_config, nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)

  def runner(config):
    def run(params, batch):
      loss, grads = jax.value_and_grad(lambda p: steps_lib.batch_loss(
          p, batch, graphdef=graphdef, config=config, objective=objective))(
              params)
      m = nnx.merge(graphdef, params)
      out = m(batch["input_ids"], batch["input_mask"], None,
              batch["masked_lm_positions"], **features.packed_inputs(batch))
      return out, loss, grads
    return jax.jit(run)

  alone, loss_pad, grads_pad = runner(pad_config)(params, padded)
  run_packed = runner(pack_config)
  together, loss_pack, grads_pack = run_packed(params, packed)
  for i, (ex, (row, start)) in enumerate(zip(exs, where)):
    n, k = len(ex["input_ids"]), len(ex["positions"])
    np.testing.assert_allclose(
        together["sequence_output"][row, start:start + n],
        alone["sequence_output"][i, :n], atol=1e-5, rtol=0, err_msg=str(i))
    p = np.flatnonzero(packed["masked_lm_positions"][row] >= start)
    p = p[np.isin(packed["masked_lm_positions"][row, p],
                  ex["positions"] + start)]
    np.testing.assert_allclose(together["mlm_logits"][row, p],
                               alone["mlm_logits"][i, :k], atol=1e-5, rtol=0)
  packed_rows.assert_same_loss_and_grads(loss_pack, grads_pack, loss_pad,
                                         grads_pad)
  changed = dict(packed)
  ids = packed["input_ids"].copy()
  first = packed["sequence_ids"] == 1
  ids[first] = (ids[first] + 7) % VOCAB
  changed["input_ids"] = ids
  other = np.asarray(run_packed(params, changed)[0]["sequence_output"])
  keep = ~first & (packed["input_mask"] > 0)
  np.testing.assert_array_equal(
      other[keep], np.asarray(together["sequence_output"])[keep])
