"""Packing in the tf.data graph (bert_jax/data/packing.py) and packed
pretraining batches: the bin packing against a plain-Python best-fit
decreasing, the row layout, nothing lost or duplicated on the way through
the pipeline, document chunks that never cross a document, the masking
statistics of every packed example, and ModernBERT reading packed rows.
"""

import collections

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import demo_corpus
from bert_jax.data import features
from bert_jax.data import packing
from bert_jax.data import pipeline
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers
from bert_jax.training import config_checks
from tests.helpers import masking_corpus

T = 64


def reference_best_fit(lengths, capacity, max_sequences):
  """Best-fit decreasing, one example at a time, in plain Python."""
  order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
  used, count = [], []
  row, slot, offset = [-1] * len(lengths), [0] * len(lengths), [0] * len(
      lengths)
  for e in order:
    n = lengths[e]
    if n == 0:
      continue
    fits = [(capacity - u, r) for r, (u, c) in enumerate(zip(used, count))
            if capacity - u >= n and c < max_sequences]
    r = min(fits)[1] if fits else len(used)
    if not fits:
      used.append(0)
      count.append(0)
    row[e], slot[e], offset[e] = r, count[r], used[r]
    used[r] += n
    count[r] += 1
  return row, slot, offset, len(used)


@pytest.mark.slow
def test_best_fit_decreasing_matches_the_reference():
  rng = np.random.default_rng(0)
  for capacity, s in ((64, 4), (128, 16), (32, 1)):
    lengths = rng.integers(3, capacity + 1, 300)
    lengths[rng.random(300) < 0.5] //= 4  # Many short ones: rows fill up.
    lengths[:7] = 0  # Window padding: placed nowhere.
    got = packing.best_fit_decreasing(tf.constant(lengths), capacity, s)
    want = reference_best_fit(lengths.tolist(), capacity, s)
    for g, w in zip(got[:3], want[:3]):
      np.testing.assert_array_equal(g.numpy(), w)
    assert int(got[3]) == want[3]
    if s > 1:  # Fewer rows than examples, close to the lower bound.
      n = (lengths > 0).sum()
      bound = max(np.ceil(lengths.sum() / capacity), np.ceil(n / s))
      assert want[3] < 0.8 * n and want[3] <= 1.1 * bound, (want[3], bound)


def test_pack_window_lays_out_every_example_once():
  rng = np.random.default_rng(1)
  w, s = 50, 5
  lengths = rng.integers(2, 30, w)
  lengths[-3:] = 0
  ids = np.zeros((w, 30), np.int32)
  types = np.zeros((w, 30), np.int32)
  for e, n in enumerate(lengths):
    ids[e, :n] = 1000 * (e + 1) + np.arange(n)
    types[e, n // 2:n] = 1
  out = packing.pack_window(
      {"input_ids": tf.constant(ids), "segment_ids": tf.constant(types)},
      {"labels": tf.range(w), "index": tf.range(w)}, tf.constant(lengths),
      seq_length=T, max_sequences=s, pad_values={"input_ids": 7, "index": -1},
      seed=tf.constant([3, 4], tf.int64))
  out = {k: v.numpy() for k, v in out.items()}
  r = len(out["input_ids"])
  assert out["input_ids"].shape == (r, T) and out["index"].shape == (r, s)
  seen = []
  for row in range(r):
    for slot in np.flatnonzero(out[packing.SEQUENCE_WEIGHTS][row]):
      e = out["index"][row, slot]
      n, start = lengths[e], out["cls_positions"][row, slot]
      span = slice(start, start + n)
      np.testing.assert_array_equal(out["input_ids"][row, span], ids[e, :n])
      np.testing.assert_array_equal(out["segment_ids"][row, span],
                                    types[e, :n])
      assert (out["sequence_ids"][row, span] == slot + 1).all()
      np.testing.assert_array_equal(out["position_ids"][row, span],
                                    np.arange(n))
      assert out["labels"][row, slot] == e
      seen.append(e)
    n_real = out["input_mask"][row].sum()
    assert (out["input_mask"][row, :n_real] == 1).all()  # Padding at the end.
    assert (out["input_ids"][row, n_real:] == 7).all()
    assert (out["sequence_ids"][row, n_real:] == 0).all()
  empty = out[packing.SEQUENCE_WEIGHTS] == 0
  assert (out["index"][empty] == -1).all() and (
      out["cls_positions"][empty] == 0).all()
  assert sorted(seen) == list(range(w - 3))
  assert out["input_mask"].sum() == lengths.sum()


# -----------------------------------------------------------------------------
# Through the pipeline.
# -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """Unique-word documents (a token id tells its document) + WordPiece."""
  d = tmp_path_factory.mktemp("packing_corpus")
  docs = demo_corpus.synthetic_documents(300, seed=2, unique_words=True,
                                         sentences=(1, 10), words=(2, 9))
  for k in range(2):
    demo_corpus.write_documents(str(d / f"part-{k}.txt"), docs[k::2])
  words = [w for doc in docs for s in doc for w in s.split()]
  vocab = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] +
           ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)
  tokenizers.save_wordpiece(vocab, str(d / "vocab.txt"))
  tok = tokenizers.load(str(d / "vocab.txt"), tokenizers.WORDPIECE, True)
  doc_of = np.full(len(vocab), -1)
  doc_of[len(vocab) - len(words):] = [
      i for i, doc in enumerate(docs) for s in doc for _ in s.split()]
  return dict(glob=str(d / "part-*.txt"), tok=tok, doc_of=doc_of)


def _config(corpus, **data):
  c = config_lib.get_config("tiny")
  c.model.vocab_size = 8192
  c.data.update(train_files=corpus["glob"], tokenizer_type="wordpiece",
                tokenizer_path=corpus["tok"].path, seq_length=T,
                max_predictions_per_seq=10, shuffle_buffer=0,
                block_lines=128, eval_fraction=0.0, short_seq_prob=0.5,
                packing=True, packing_max_sequences=6, packing_window=256)
  c.data.update(data)
  if c.data.objective == "packed":
    c.data.nsp = False
  c.train.update(batch_size=8, seed=5)
  return c


def _examples(config, tok, workdir):
  """One epoch of unbatched examples (the builder's, before packing)."""
  plan = data_sources.plan(config.data, workdir)
  return pipeline.example_dataset(config, tok, plan, epochs=1)


def _unpacked(rows):
  """Packed rows -> (ids, types, label) of every example in them."""
  out = []
  for r in range(len(rows["input_ids"])):
    for slot in np.flatnonzero(rows["next_sentence_weights"][r]):
      at = rows["sequence_ids"][r] == slot + 1
      assert rows["cls_positions"][r, slot] == np.argmax(at)
      out.append((tuple(rows["input_ids"][r, at]),
                  tuple(rows["segment_ids"][r, at]),
                  int(rows["next_sentence_labels"][r, slot])))
  return out


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["nsp", "packed"])
def test_packed_pipeline_holds_exactly_the_examples(corpus, tmp_path,
                                                   objective):
  """Packing loses, duplicates and changes nothing: the examples found in
  one epoch of packed rows are the builder's examples, and the rows hold
  fewer padding slots. Document chunks never cross a document."""
  tok = corpus["tok"]
  c = _config(corpus, objective=objective)
  ds = _examples(c, tok, str(tmp_path))
  built = []
  for ex in ds.batch(1024):
    for ids, types, mask, label in zip(
        *(ex[k].numpy() for k in ("input_ids", "segment_ids", "input_mask",
                                  "next_sentence_labels"))):
      n = int(mask.sum())
      built.append((tuple(ids[:n]), tuple(types[:n]), int(label)))
  rows = collections.defaultdict(list)
  for b in pipeline.packed_rows(ds, c.data, tok, np.array([1, 2])).batch(1024):
    for k, v in b.items():
      rows[k].append(v.numpy())
  rows = {k: np.concatenate(v) for k, v in rows.items()}
  if objective == "packed":
    for ids, _, _ in built:
      assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id
      assert len(set(corpus["doc_of"][list(ids[1:-1])])) == 1
  assert collections.Counter(_unpacked(rows)) == collections.Counter(built)
  assert len(rows["input_ids"]) < 0.75 * len(built)
  assert (rows["input_mask"].mean() >
          np.mean([len(b[0]) for b in built]) / T + 0.2)
  # The batches the trainer gets: masked, in the packed spec.
  it = pipeline.create_train_iterator(c, tok, str(tmp_path))
  batch = next(it)
  shapes = features.batch_shapes(features.PACKED_PRETRAINING, 8, T, 10, 6)
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == shapes


@pytest.mark.slow
def test_masking_per_packed_example(tmp_path):
  """The MLM budget of a packed row (max_predictions_per_seq, 15% of its
  real non-special tokens) spreads over its examples: short and long ones
  get 15% each, 80/10/10, never a special token or padding."""
  tok, rows = masking_corpus.corpus(tmp_path)
  p = masking_corpus.P
  lengths = (rows != tok.pad_id).sum(1)
  packed = packing.pack_window(
      {"input_ids": tf.constant(rows)}, {}, tf.constant(lengths),
      seq_length=masking_corpus.T, max_sequences=4,
      pad_values={"input_ids": tok.pad_id})
  ids = packed["input_ids"].numpy()
  seq = packed["sequence_ids"].numpy()
  assert (seq.max(1) >= 2).mean() > 0.5  # Most rows hold several examples.
  out = masking_corpus.run(masking_corpus.make(tok), ids)
  special = np.isin(ids, tok.special_ids)
  n_ok = (~special).sum(1)
  want = np.minimum(p, np.maximum(1, np.round(0.15 * n_ok).astype(int)))
  np.testing.assert_array_equal(out["masked_lm_weights"].sum(1), want)
  kind, r, pos = masking_corpus.outcomes(ids, out, tok)
  assert not special[r, pos].any() and (seq[r, pos] > 0).all()
  frac = np.bincount(kind, minlength=3) / len(kind)
  np.testing.assert_allclose(frac, [0.8, 0.1, 0.1], atol=0.015)
  # Per example: selected / selectable, by example length.
  selected = np.zeros_like(ids)
  selected[r, pos] = 1
  per = collections.defaultdict(lambda: [0, 0])
  for i in range(len(ids)):
    for k in range(1, seq[i].max() + 1):
      at = (seq[i] == k) & ~special[i]
      key = "short" if at.sum() < 24 else "long"
      per[key][0] += selected[i][at].sum()
      per[key][1] += at.sum()
  for key, (hit, total) in per.items():
    assert total > 10_000, (key, total)  # 3 sigma of the rate < 0.011.
    assert abs(hit / total - 0.15) < 0.011, (key, hit / total)


def test_packing_config_checks(corpus):
  c = _config(corpus)
  c.mesh.update(data=1, fsdp=1, tensor=1)
  config_checks.validate(c, 1, check_sources=False)
  bad = [({"objective.name": "electra", "data.nsp": False,
           "data.objective": "packed"},
          "objective.name=.electra.: packed rows are read by"),
         ({"data.packing_max_sequences": 33}, "packing_max_sequences=33"),
         ({"data.packing_window": 0}, "packing_window=0")]
  for fields, message in bad:
    b = _config(corpus)
    b.mesh.update(data=1, fsdp=1, tensor=1)
    for key, value in fields.items():
      group, name = key.split(".")
      b[group][name] = value
    with pytest.raises(ValueError, match=message):
      config_checks.validate(b, 1, check_sources=False)


@pytest.mark.slow
def test_modernbert_pretrains_on_packed_document_chunks(corpus, tmp_path):
  """data.packing serves ModernBERT: the config passes every check, the
  pipeline's packed rows are the objective's features, its loss on them is
  finite, and the step's real work counts each document's own attention
  (fewer query-key pairs than full rows, so fewer FLOPs)."""
  import jax
  from flax import nnx

  from bert_jax import compose
  from bert_jax.models import flops as flops_lib
  from bert_jax.training import steps as steps_lib
  from tests.helpers import family_checks
  c = _config(corpus, objective="packed")
  c.objective.name = "modernbert"
  c.model.update(family_checks.MODERNBERT_TINY, local_attention=16)
  config_checks.validate(c, 1, check_sources=False)
  objective = compose.objective(c)
  batch = next(pipeline.create_train_iterator(c, corpus["tok"], str(tmp_path)))
  assert set(objective.feature_spec(c)) == set(batch)
  assert batch["sequence_ids"].max() > 1  # Several documents a row.
  model = objective.make_model(c, nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  loss = jax.jit(lambda p, b: steps_lib.batch_loss(
      p, b, graphdef=graphdef, config=c, objective=objective))(params, batch)
  assert np.isfinite(float(loss)) and float(loss) > 0
  work = {k: float(v) for k, v in steps_lib.batch_work(batch).items()}
  real = compose.train_flops_per_step(c, flops_lib.Work(
      tokens=work["tokens"], attended=work["attended"],
      predictions=work["predictions"]))
  assert work["attended"] < work["tokens"] * T
  assert real < compose.train_flops_per_step(c)
