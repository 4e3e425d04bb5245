"""ModernBERT's model (bert_jax/models/modernbert.py, rope_attention.py):
the sliding window is Hugging Face's, the blocked window equals the dense
one, packed documents see only themselves with positions restarting, the
attention kinds agree, and both configs have Hugging Face's parameter
counts."""

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax.models import attention
from bert_jax.models import flops as flops_lib
from bert_jax.models import modernbert
from bert_jax.models import rope_attention
from tests.helpers import family_checks


def tiny(**model):
  config = family_checks.family_config("modernbert")
  config.model.update(model)
  return config.model


def jitted(model, method="__call__"):
  """`model.<method>` jitted over its state (eager dispatch is slow)."""
  graphdef, state = nnx.split(model)
  return jax.jit(lambda s, *a, **kw: getattr(nnx.merge(graphdef, s), method)(
      *a, **kw), static_argnames=("num_layers",)), state


def padded_mask(lengths, t):
  return (np.arange(t)[None] < np.asarray(lengths)[:, None]).astype(np.int32)


# ------------------------------------------------------------------------------
# Who sees whom.
# ------------------------------------------------------------------------------
def test_sliding_window_is_hugging_faces_at_the_edges_and_near_padding():
  """Every real query sees exactly the keys HF's sliding-window mask lets it
  see: |i - j| <= local_attention // 2 (inclusive at both edges), padding
  never. A padded query sees only padding (HF lets it see real keys; its
  output is never read, and no row is ever empty)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from transformers import masking_utils
  t, window = 40, 8
  lengths = [40, 27, 5, 13]  # Full, ends mid-window, shorter than a window.
  mask2d = padded_mask(lengths, t)
  cfg = transformers.ModernBertConfig(
      vocab_size=32, hidden_size=16, num_attention_heads=2, num_hidden_layers=3,
      intermediate_size=8, local_attention=window, pad_token_id=0,
      bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
  cfg._attn_implementation = "sdpa"  # Boolean masks.
  embeds = torch.zeros(len(lengths), t, 16)
  theirs = {}
  for kind, make in (("local", masking_utils.
                      create_bidirectional_sliding_window_mask),
                     ("global", masking_utils.create_bidirectional_mask)):
    theirs[kind] = make(config=cfg, inputs_embeds=embeds,
                        attention_mask=torch.tensor(mask2d),
                        allow_is_bidirectional_skip=False)[:, 0].numpy()
  mask = attention.make_mask(mask2d)  # What ModernBertModel builds.
  real = mask2d.astype(bool)
  for kind, w in (("local", (window // 2,) * 2), ("global", None)):
    ours = np.broadcast_to(attention.allowed(mask, w),
                           (len(lengths), 1, t, t))[:, 0]
    np.testing.assert_array_equal(ours[real], theirs[kind][real], kind)
    pad_rows = ours[~real]
    if kind == "global":  # Padded queries: the real keys, as HF's.
      np.testing.assert_array_equal(pad_rows,
                                    real.repeat(t - real.sum(1), 0))
    else:  # Padded queries: only padding (no window is empty).
      assert not np.any(pad_rows & real.repeat(t - real.sum(1), 0)), kind
      assert np.all(pad_rows[np.arange(len(pad_rows)),
                             np.nonzero(~real)[1]]), kind
  # The edges themselves: query 20 of the full row sees keys 16..24.
  local = np.asarray(attention.allowed(mask, (4, 4)))[:, 0]
  assert np.flatnonzero(local[0, 20]).tolist() == list(range(16, 25))
  assert np.flatnonzero(local[1, 25]).tolist() == [21, 22, 23, 24, 25, 26]


def _qkv(b, t, h, d, seed=0):
  k = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(x, (b, t, h, d)) for x in k)


def _attend(q, k, v, mask, impl, window):
  return jax.jit(lambda q, k, v, mask: attention.attend(
      q, k, v, mask, impl=impl, window=window, splash_interpret=True))(
          q, k, v, mask)


def test_blocked_sliding_window_equals_the_dense_one():
  """Queries in blocks of local_attention / 2 against three blocks of keys
  give the dense masked attention's output at every position (padded and
  packed rows), and count 3 x 4 keys per query instead of 64."""
  config = tiny(local_attention=8)
  window = rope_attention.window(config, is_global=False)
  b, t = 3, 64
  q, k, v = _qkv(b, t, 4, 16)
  seq = padded_mask([64, 37, 3], t)
  seq[0, 30:] = 2  # Row 0 packs two documents.
  assert window == (4, 4) and attention.blocked(t, window)
  assert attention.keys_per_query(t, window) == 12
  assert attention.keys_per_query(t, None) == t
  for mask in (attention.make_mask(padded_mask([64, 37, 3], t)),
               attention.make_mask(seq > 0, seq)):
    # "dot_product_attention" on CPU: XLA over the dense boolean mask.
    np.testing.assert_allclose(
        _attend(q, k, v, mask, "xla", window),
        _attend(q, k, v, mask, "dot_product_attention", window), atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("impl", ["dot_product_attention", "splash"])
def test_attention_kinds_equal_xla(impl):
  """jax.nn.dot_product_attention (XLA here) and the splash kernel (Pallas
  interpreter) with the LocalMask band equal our XLA path everywhere, on
  padded and packed rows."""
  t = 256 if impl == "splash" else 64
  q, k, v = _qkv(2, t, 4, 16, seed=1)
  seq = padded_mask([t, t - 70], t)
  seq[0, t // 2:] = 2
  for mask in (attention.make_mask(padded_mask([t, t - 70], t)),
               attention.make_mask(seq > 0, seq)):
    for window in (None, (32, 32)):
      np.testing.assert_allclose(
          _attend(q, k, v, mask, impl, window),
          _attend(q, k, v, mask, "xla", window), atol=2e-5,
          err_msg=f"{window} packed={mask.packed}")


@pytest.mark.slow
def test_packed_documents_see_only_themselves_with_their_own_positions():
  """Two documents packed in one row (sequence ids 1, 2; positions
  restarting) give each the hidden states it gets alone in a padded row:
  RoPE positions and the sliding window restart per segment."""
  config = tiny(local_attention=8)
  model = modernbert.ModernBertModel(config, rngs=nnx.Rngs(3))
  r = np.random.RandomState(0)
  a, b = r.randint(5, 256, 12), r.randint(5, 256, 20)
  packed = np.concatenate([a, b])[None].astype(np.int32)
  positions = np.concatenate([np.arange(12), np.arange(20)])[None]
  seq = np.asarray([[1] * 12 + [2] * 20], np.int32)
  fn, state = jitted(model)
  got, _ = fn(state, packed, np.ones_like(packed), position_ids=positions,
              sequence_ids=seq)
  for doc, span in ((a, slice(0, 12)), (b, slice(12, 32))):
    row = np.zeros((1, 32), np.int32)
    row[0, :len(doc)] = doc
    alone, _ = fn(state, row, padded_mask([len(doc)], 32))
    np.testing.assert_allclose(got[0, span], alone[0, :len(doc)], atol=1e-5)


def test_hidden_states_are_indexed_as_hugging_faces():
  """0: embeddings; L: after the final norm (the model's output)."""
  config = tiny()
  model = modernbert.ModernBertModel(config, rngs=nnx.Rngs(0))
  ids = np.random.RandomState(1).randint(5, 256, (2, 32)).astype(np.int32)
  mask = padded_mask([32, 20], 32)
  states, state = jitted(model, "hidden_states")
  forward, _ = jitted(model)
  all_states = states(state, ids, mask)
  assert len(all_states) == config.num_hidden_layers + 1
  np.testing.assert_allclose(all_states[-1], forward(state, ids, mask)[0],
                             atol=1e-6)
  first = states(state, ids, mask, num_layers=1)
  assert len(first) == 2
  np.testing.assert_allclose(first[1], all_states[1], atol=1e-6)


# ------------------------------------------------------------------------------
# Sizes and FLOPs.
# ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name, with_head, encoder", [
    ("modernbert_base", 149_655_232, 149_014_272),
    ("modernbert_large", 395_881_664, 394_781_696),
])
def test_param_counts_equal_hugging_face(name, with_head, encoder):
  """configs/modernbert_{base,large}.py against HF's ModernBertForMaskedLM
  of the same ModernBertConfig (built on the meta device: no memory)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from bert_jax import families
  from bert_jax.families import modernbert as modernbert_family
  config = family_checks.load_config(name)
  model = nnx.eval_shape(lambda: families.objective("modernbert").make_model(
      config, nnx.Rngs(0)))
  count = lambda m: sum(x.size for x in jax.tree.leaves(nnx.state(
      m, nnx.Param)))
  hf_cfg = transformers.ModernBertConfig(**{
      k: v for k, v in modernbert_family.config_to_hf(config.model).items()
      if k not in ("architectures", "model_type", "dtype")})
  with torch.device("meta"):
    hf = transformers.ModernBertForMaskedLM(hf_cfg)
  assert count(model) == sum(p.numel() for p in hf.parameters()) == with_head
  assert count(model.model) == sum(
      p.numel() for p in hf.model.parameters()) == encoder


def test_sliding_window_flops_grow_linearly():
  """Per token, a sliding-window layer's attention costs 12 d x 3 w/2 at
  any length (blocked) and a global one 12 d T: from 512 to 8,192 tokens
  ModernBERT-base's encoder FLOPs per token grow 1.78x, BERT-base's 2.50x
  (8 of its 22 layers are global)."""
  base = family_checks.load_config("modernbert_base").model
  per_token = lambda t: flops_lib.modernbert_encoder_flops(
      base, flops_lib.full_rows(1, t, 0), t) / t
  d, layers = 768, 22
  dense = 6 * layers * (4 * d * d + 3 * d * 1152)
  assert per_token(8192) == dense + 12 * d * (8 * 8192 + 14 * 192)
  growth = per_token(8192) / per_token(512)
  from bert_jax import config_lib
  bert = config_lib.model_config("base")
  bert_growth = (flops_lib.encoder_flops_per_token(bert, 8192)
                 / flops_lib.encoder_flops_per_token(bert, 512))
  assert round(growth, 2) == 1.78 and round(bert_growth, 2) == 2.50, (
      growth, bert_growth)
