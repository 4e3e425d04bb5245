"""Input pipeline: example builders, sources, sharding, resume, bad data.

Corpora are generated in tmp dirs. The structural tests use a corpus in which
every word is a distinct ``w<n>`` (numbered in reading order) and a WordPiece
vocabulary holding exactly those words, so each token id tells its document
and position.
"""

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import demo_corpus
from bert_jax.data import examples
from bert_jax.data import features
from bert_jax.data import masking
from bert_jax.data import pipeline
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers
from bert_jax.training import config_checks
from tests import helpers

T = 32
NUM_DOCS = 800


def bert_like_vocab(words):
  """bert-base-uncased layout: [PAD]=0, [unused*], [UNK]=100, [CLS]=101, ..."""
  return (["[PAD]"] + [f"[unused{i}]" for i in range(99)] +
          ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(words))


@pytest.fixture(scope="module")
def uniq(tmp_path_factory):
  """Unique-word corpus in 4 files + WordPiece tokenizer + token->doc map."""
  d = tmp_path_factory.mktemp("uniq")
  docs = demo_corpus.synthetic_documents(NUM_DOCS, seed=1, unique_words=True,
                                         sentences=(1, 8), words=(2, 9))
  for k in range(4):
    demo_corpus.write_documents(str(d / f"part-{k}.txt"), docs[k::4])
  words = [w for doc in docs for s in doc for w in s.split()]
  vocab = bert_like_vocab(words)
  vocab_path = str(d / "vocab.txt")
  tokenizers.save_wordpiece(vocab, vocab_path)
  tok = tokenizers.load(vocab_path, tokenizers.WORDPIECE, lower_case=True)
  first = len(vocab) - len(words)
  # token id -> (doc index, word index in corpus order)
  doc_of = np.full(len(vocab), -1)
  order = np.full(len(vocab), -1)
  g = 0
  for di, doc in enumerate(docs):
    for s in doc:
      for _ in s.split():
        doc_of[first + g] = di
        order[first + g] = g
        g += 1
  last_of_doc = {di: max(order[doc_of == di]) for di in range(len(docs))}
  first_of_doc = {di: min(order[doc_of == di]) for di in range(len(docs))}
  return dict(dir=str(d), glob=str(d / "part-*.txt"), tok=tok, docs=docs,
              doc_of=doc_of, order=order, first=first, last_of_doc=last_of_doc,
              first_of_doc=first_of_doc)


def make_config(files, tok_path="", kind="wordpiece", **data):
  c = config_lib.get_config("tiny")
  c.model.vocab_size = 60_000
  c.data.train_files = files
  c.data.tokenizer_type = kind
  c.data.tokenizer_path = tok_path
  c.data.seq_length = T
  c.data.max_predictions_per_seq = 6
  c.data.shuffle_buffer = 64
  c.data.block_lines = 256
  c.data.eval_fraction = 0.0
  c.data.num_eval_batches = 2
  c.train.batch_size = 16
  c.train.seed = 3
  for k, v in data.items():
    setattr(c.data, k, v)
  if c.data.objective == "packed":
    c.data.nsp = False
  return c


def one_epoch_examples(config, tok, workdir, pi=0, pc=1, mode="train"):
  plan = data_sources.plan(config.data, workdir)
  ds = pipeline.example_dataset(config, tok, plan, pi, pc, mode, epochs=1)
  rows = []
  for ex in ds.batch(512):
    rows.extend(tuple(r) for r in ex["input_ids"].numpy())
  return rows


# -----------------------------------------------------------------------------


@pytest.mark.slow
def test_batch_shapes_and_dtypes(uniq, tmp_path):
  for obj in ("nsp", "sop", "packed"):
    c = make_config(uniq["glob"], uniq["tok"].path, objective=obj)
    it = pipeline.create_train_iterator(c, uniq["tok"], str(tmp_path))
    for _ in range(2):
      b = next(it)
      expect = dict(input_ids=(np.int32, (16, T)), input_mask=(np.int32, (16, T)),
                    segment_ids=(np.int32, (16, T)),
                    masked_lm_positions=(np.int32, (16, 6)),
                    masked_lm_ids=(np.int32, (16, 6)),
                    masked_lm_weights=(np.float32, (16, 6)),
                    next_sentence_labels=(np.int32, (16,)))
      assert set(b) == set(expect)
      for k, (dt, shape) in expect.items():
        assert b[k].dtype == dt and b[k].shape == shape, k
    if obj == "packed":
      assert (b["next_sentence_labels"] == 0).all()
      assert (b["segment_ids"] == 0).all()


def _split_pair(row, tok):
  ids = [int(x) for x in row if x != tok.pad_id]
  assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id
  s = ids.index(tok.sep_id)
  return ids[1:s], ids[s + 1:-1]


@pytest.mark.slow
@pytest.mark.parametrize("obj", ["nsp", "sop"])
def test_pairs_labels_segments_and_order(uniq, tmp_path, obj):
  tok = uniq["tok"]
  c = make_config(uniq["glob"], tok.path, objective=obj, short_seq_prob=0.1)
  doc_of, order = uniq["doc_of"], uniq["order"]
  labels = []
  n_short = 0
  plan = data_sources.plan(c.data, str(tmp_path))
  ds = pipeline.example_dataset(c, tok, plan, 0, 1, "train", epochs=3)
  for ex in ds.batch(1024):
    for ids, seg, mask, lab in zip(ex["input_ids"].numpy(),
                                   ex["segment_ids"].numpy(),
                                   ex["input_mask"].numpy(),
                                   ex["next_sentence_labels"].numpy()):
      n = int(mask.sum())
      assert (mask[:n] == 1).all() and (mask[n:] == 0).all()
      a, b = _split_pair(ids, tok)
      assert a and b
      # segment ids: 0 for [CLS] A [SEP], 1 for B [SEP], 0 on padding.
      want = [0] * (len(a) + 2) + [1] * (len(b) + 1) + [0] * (T - n)
      assert seg.tolist() == want
      assert n <= T
      n_short += n < T // 2
      oa, ob = order[a], order[b]
      assert (np.diff(oa) > 0).all() and (np.diff(ob) > 0).all()
      da, db = set(doc_of[a]), set(doc_of[b])
      assert len(da) == 1 and len(db) == 1
      if obj == "nsp" and lab == 1:
        assert da != db
      elif obj == "sop" and lab == 1:
        assert da == db and ob.max() < oa.min()
      else:
        assert da == db and oa.max() < ob.min()
      labels.append(int(lab))
  assert len(labels) > 2500
  assert abs(np.mean(labels) - 0.5) < 0.02, np.mean(labels)
  assert n_short > 0.03 * len(labels)


@pytest.mark.slow
def test_packing(uniq, tmp_path):
  tok = uniq["tok"]
  c = make_config(uniq["glob"], tok.path, objective="packed")
  doc_of, order = uniq["doc_of"], uniq["order"]
  rows = one_epoch_examples(c, tok, str(tmp_path))
  total = 0
  for row in rows:
    ids = [x for x in row if x != tok.pad_id]
    assert len(ids) <= T
    assert ids[0] == tok.cls_id and ids[-1] == tok.sep_id
    body = ids[1:]
    # Split on [SEP]: each piece is a contiguous run of one document, and a
    # [SEP] before the end sits exactly at the end of a document.
    pieces, cur = [], []
    for x in body:
      if x == tok.sep_id:
        pieces.append((cur, True))
        cur = []
      else:
        cur.append(x)
    assert not cur
    for k, (p, _) in enumerate(pieces):
      assert p, "empty segment between separators"
      o = order[p]
      assert (np.diff(o) == 1).all(), "not contiguous"
      assert len(set(doc_of[p])) == 1
      if k < len(pieces) - 1:
        assert o[-1] == uniq["last_of_doc"][doc_of[p[0]]]
      if k > 0:
        assert o[0] == uniq["first_of_doc"][doc_of[p[0]]]
      total += len(p)
  # Nothing lost: every corpus token appears once per epoch.
  assert total == len(order[order >= 0])


@pytest.mark.slow
def test_save_restore_continues_identically(uniq, tmp_path):
  tok = uniq["tok"]
  # Two sources mixed by weight, shuffling, whole-word masking.
  files = sorted(tf.io.gfile.glob(uniq["glob"]))
  c = make_config("", tok.path, whole_word_mask=True,
                  sources=f"{files[0]},{files[1]}@0.7;text:{files[2]}@0.3")
  restored = helpers.assert_train_iterator_resumes_exactly(
      c, tok, tmp_path, saved_after=5, compared=6)
  assert os.path.isdir(tmp_path / "ckpt" / "process_0")
  with pytest.raises(ValueError, match="No data iterator state"):
    restored.restore(str(tmp_path / "nothing"))


@pytest.mark.slow
def test_eval_batches_identical_and_held_out(uniq, tmp_path):
  tok = uniq["tok"]
  c = make_config(uniq["glob"], tok.path, eval_fraction=0.1,
                  num_eval_batches=3)
  e1 = pipeline.create_eval_batches(c, tok, str(tmp_path))
  pipeline._eval_batches.cache_clear()
  e2 = pipeline.create_eval_batches(c, tok, str(tmp_path))
  assert len(e1) == 3
  for a, b in zip(e1, e2):
    for k in features.PRETRAINING_NAMES:
      np.testing.assert_array_equal(a[k], b[k])
  doc_of = uniq["doc_of"]
  eval_ids = [masking.unmasked_ids(b) for b in e1]
  eval_docs = {int(d) for ids in eval_ids
               for d in doc_of[ids[ids >= uniq["first"]]]}
  train_rows = one_epoch_examples(c, tok, str(tmp_path))
  train_docs = {int(d) for r in train_rows for d in doc_of[np.array(r)[np.array(r) >= uniq["first"]]]}
  assert eval_docs and not eval_docs & train_docs
  assert len(train_docs) > 0.8 * NUM_DOCS


@pytest.mark.slow
@pytest.mark.parametrize("files", ["many", "one"])
def test_two_processes_disjoint_and_complete(uniq, tmp_path, files):
  tok = uniq["tok"]
  glob = uniq["glob"] if files == "many" else sorted(
      tf.io.gfile.glob(uniq["glob"]))[0]
  c = make_config(glob, tok.path, objective="packed")
  single = one_epoch_examples(c, tok, str(tmp_path))
  p0 = one_epoch_examples(c, tok, str(tmp_path), 0, 2)
  p1 = one_epoch_examples(c, tok, str(tmp_path), 1, 2)
  assert p0 and p1
  assert not set(p0) & set(p1)
  assert collections.Counter(p0 + p1) == collections.Counter(single)


@pytest.mark.slow
def test_per_host_batch(uniq, tmp_path):
  tok = uniq["tok"]
  c = make_config(uniq["glob"], tok.path)
  it = pipeline.create_train_iterator(c, tok, str(tmp_path), process_index=1,
                                process_count=2)
  assert next(it)["input_ids"].shape == (8, T)
  with pytest.raises(ValueError, match="not divisible"):
    pipeline.create_train_iterator(c, tok, str(tmp_path), process_index=0,
                             process_count=3)


@pytest.mark.slow
def test_bad_data_is_skipped_and_counted(uniq, tmp_path):
  tok = uniq["tok"]
  d = tmp_path / "bad"
  d.mkdir()
  good = uniq["docs"][:200]
  text = "\n\n".join("\n".join(s) for s in good)
  (d / "a_empty.txt").write_bytes(b"")
  long_sentence = " ".join(good[0][0].split() * 40)  # >> seq_length tokens
  big_doc = "w1 " * (10 * 1024 * 1024 // 3)  # one 10 MB line
  content = (
      text + "\n\n"
      "   \n\t\n  \n\n"  # whitespace-only document
      + good[1][0] + " \xff\xfe bad bytes\n" + long_sentence + "\n\n"
      + big_doc + "\n\n" + text + "\n")
  (d / "b_mixed.txt").write_bytes(
      content.encode("utf-8", errors="surrogateescape").replace(
          "\xff\xfe".encode("utf-8"), b"\xff\xfe"))
  c = make_config(str(d / "*.txt"), tok.path, shuffle_buffer=0)
  it = pipeline.create_train_iterator(c, tok, str(tmp_path))
  for _ in range(40):
    b = next(it)
    assert b["input_ids"].shape == (16, T)
  st = it.stats
  assert st["invalid_utf8_lines"] >= 1, st
  assert st["long_lines"] >= 1, st
  assert st["long_sentences"] >= 2, st
  assert st["blank_lines"] >= 3, st


def _validate(config, tok):
  """The startup checks the trainer runs: the config, then the tokenizer."""
  config_checks.validate(config, num_devices=1)
  config_checks.check_tokenizer(config, tok)


def test_empty_corpus_raises_not_hangs(uniq, tmp_path):
  tok = uniq["tok"]
  (tmp_path / "e1.txt").write_bytes(b"")
  c = make_config(str(tmp_path / "e1.txt"), tok.path)
  with pytest.raises(ValueError, match="e1.txt"):
    _validate(c, tok)
  (tmp_path / "ws.txt").write_text("   \n\n\t\n \n")
  c = make_config(str(tmp_path / "ws.txt"), tok.path)
  with pytest.raises(ValueError, match="produced no examples"):
    pipeline.create_train_iterator(c, tok, str(tmp_path))
  c = make_config(str(tmp_path / "missing-*.txt"), tok.path)
  with pytest.raises(ValueError, match="missing-"):
    _validate(c, tok)


def test_validate_messages(uniq):
  tok = uniq["tok"]
  c = make_config(uniq["glob"], tok.path)
  _validate(c, tok)
  c.model.vocab_size = 1000
  with pytest.raises(ValueError, match=r"model.vocab_size=1000"):
    _validate(c, tok)
  c = make_config(uniq["glob"], tok.path, eval_files="/nonexistent/ev-*.txt")
  with pytest.raises(ValueError, match=r"data.eval_files.*ev-\*"):
    _validate(c, tok)
  c = make_config(uniq["glob"], tok.path, seq_length=1024)
  with pytest.raises(ValueError, match=r"seq_length=1024.*max_position_embeddings=512"):
    _validate(c, tok)
  c = make_config(uniq["glob"], tok.path, max_predictions_per_seq=40)
  with pytest.raises(ValueError, match="max_predictions_per_seq=40"):
    _validate(c, tok)
  c = make_config(uniq["glob"], tok.path, objective="packed")
  c.data.nsp = True
  with pytest.raises(ValueError, match="conflicts"):
    _validate(c, tok)
  no_mask = tokenizers.WordPieceTokenizer(
      [p for p in tok.pieces if p != "[MASK]"], lower_case=True, path="v.txt")
  c = make_config(uniq["glob"], tok.path)
  with pytest.raises(ValueError, match=r"\[MASK\]"):
    _validate(c, no_mask)


# --- TFDS ---------------------------------------------------------------------


def _make_tfds(data_dir, docs):
  import tensorflow_datasets as tfds

  class BertTestText(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
          builder=self,
          features=tfds.features.FeaturesDict(
              {"text": tfds.features.Text(), "title": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples()}

    def _generate_examples(self):
      for i, doc in enumerate(docs):
        # Wikipedia-like: paragraphs of several sentences.
        yield i, {"text": " ".join(doc[:3]) + ".\n\n" + ". ".join(doc[3:]),
                  "title": f"doc {i}"}

  builder = BertTestText(data_dir=data_dir)
  builder.download_and_prepare()
  return builder.name


@pytest.mark.slow
def test_tfds_source_mixed_with_text(uniq, tmp_path):
  tok = uniq["tok"]
  docs = [[s.replace("w", "W", 1) for s in d] for d in uniq["docs"][:300]]
  name = _make_tfds(str(tmp_path / "tfds"), docs)
  files = sorted(tf.io.gfile.glob(uniq["glob"]))
  c = make_config("", tok.path, sources=f"tfds:{name}:train@1;{files[3]}@1",
                  tfds_data_dir=str(tmp_path / "tfds"), shuffle_buffer=0)
  _validate(c, tok)
  it = pipeline.create_train_iterator(c, tok, str(tmp_path))
  b = next(it)
  assert b["input_ids"].shape == (16, T)
  # TFDS shards by example across processes: disjoint, together complete.
  src = data_sources.Source(data_sources.TFDS, name, "train")
  get = lambda pi, pc: [x.decode() for x in data_sources.tfds_documents(
      src, str(tmp_path / "tfds"), "text", pi, pc).as_numpy_iterator()]
  whole, p0, p1 = get(0, 1), get(0, 2), get(1, 2)
  assert sorted(p0 + p1) == sorted(whole) and not set(p0) & set(p1)
  with pytest.raises(ValueError, match="not prepared|cannot load"):
    data_sources.tfds_builder(data_sources.Source("tfds", "nope_ds"),
                              str(tmp_path / "tfds"))


# --- The demo path the trainer uses -------------------------------------------


@pytest.mark.slow
def test_demo_corpus_default_path(tmp_path):
  c = config_lib.get_config("tiny")
  c.data.tokenizer_vocab_size = 500
  c.model.vocab_size = 512
  c.data.seq_length = 64
  c.data.shuffle_buffer = 128
  c.data.num_eval_batches = 2
  c.train.batch_size = 8
  wd = str(tmp_path)
  tok = tokenizers.load_tokenizer(c.data, wd)
  assert tok.vocab_size <= 500
  _validate(c, tok)
  it = pipeline.create_train_iterator(c, tok, wd)
  b = next(it)
  assert b["input_ids"].shape == (8, 64)
  assert set(np.unique(b["next_sentence_labels"])) <= {0, 1}
  ev = pipeline.create_eval_batches(c, tok, wd)
  assert len(ev) == 2
  text = tok.decode(ev[0]["input_ids"][0])
  assert text.startswith("[CLS]")
  files = tf.io.gfile.glob(os.path.join(wd, "demo_corpus_v1", "*.txt"))
  assert len(files) == demo_corpus.NUM_TRAIN_FILES + 1


@pytest.mark.slow
def test_nsp_balanced_on_one_long_document(uniq, tmp_path):
  """A book-like file (one document) still gets ~50% random-next pairs."""
  tok = uniq["tok"]
  book = [s for doc in uniq["docs"][:400] for s in doc]
  path = demo_corpus.write_documents(str(tmp_path / "book.txt"), [book])
  c = make_config(path, tok.path, objective="nsp")
  labels = []
  plan = data_sources.plan(c.data, str(tmp_path))
  for ex in pipeline.example_dataset(c, tok, plan, 0, 1, "train",
                               epochs=2).batch(1024):
    labels.extend(ex["next_sentence_labels"].numpy().tolist())
  assert len(labels) > 500
  assert abs(np.mean(labels) - 0.5) < 0.05, np.mean(labels)


def test_chunking_matches_sequential_greedy():
  """The vectorized chunker equals the per-line loop of the reference."""
  rng = np.random.default_rng(0)
  for _ in range(20):
    n = int(rng.integers(1, 300))
    lens = rng.integers(1, 40, size=n)
    new_doc = rng.random(n) < 0.1
    new_doc[0] = True
    targets = rng.integers(2, 60, size=n)
    doc_last = np.zeros(n, int)
    for i in reversed(range(n)):
      doc_last[i] = i if (i == n - 1 or new_doc[i + 1]) else doc_last[i + 1]
    cum = np.cumsum(lens)
    close = np.searchsorted(cum, cum - lens + targets, side="left")
    nxt = np.minimum(close, doc_last) + 1
    got = examples._chain_starts(tf.constant(nxt, tf.int32),
                                 tf.constant(new_doc), 512).numpy()
    want = np.zeros(n, bool)
    cur, start = 0, 0
    for i in range(n):  # create_pretraining_data.py's accumulation loop
      if new_doc[i] or cur == 0:
        want[i], cur, start = True, 0, i
      cur += lens[i]
      if cur >= targets[start] or i == doc_last[i]:
        cur = 0
    np.testing.assert_array_equal(got, want)


@pytest.mark.slow
def test_inspect_data_tool_saves_npz(uniq, tmp_path):
  from tests.helpers import REPO
  from tests.helpers import run_tool
  out = str(tmp_path / "b.npz")
  r = run_tool(
      "inspect_data.py",
      f"--config={os.path.join(REPO, 'bert_jax', 'config_lib.py')}:tiny",
      f"--config.data.train_files={uniq['glob']}",
      "--config.data.tokenizer_type=wordpiece",
      f"--config.data.tokenizer_path={uniq['tok'].path}",
      "--config.model.vocab_size=60000", "--config.data.seq_length=32",
      "--config.data.max_predictions_per_seq=6",
      "--config.data.shuffle_buffer=16", "--config.train.batch_size=4",
      f"--workdir={tmp_path}", "--num_batches=2", f"--save={out}",
      timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "[MASK:" in r.stdout
  d = np.load(out)
  assert d["input_ids"].shape == (8, 32) and d["word_start"].dtype == bool
  assert int(d["mask_token_id"]) == uniq["tok"].mask_id
  assert int(d["vocab_size"]) == uniq["tok"].vocab_size
  for k in features.PRETRAINING_NAMES:
    assert k in d


@pytest.mark.slow
def test_traced_stages_and_eval_batches_are_cached(uniq, tmp_path):
  """A second pipeline for the same tokenizer reuses the traced functions;
  eval batches are built once per (config, tokenizer file, process)."""
  tok = uniq["tok"]
  c = make_config(uniq["glob"], tok.path, eval_fraction=0.1)
  wd = str(tmp_path)
  pipeline.create_train_iterator(c, tok, wd)
  builders, maskers = (pipeline.traced_builder.cache_info().misses,
                       pipeline.traced_masker.cache_info().misses)
  next(pipeline.create_train_iterator(c, tok, wd))
  assert pipeline.traced_builder.cache_info().misses == builders
  assert pipeline.traced_masker.cache_info().misses == maskers
  # Another Tokenizer object (its own tf_text resources) gets its own trace.
  tok2 = tokenizers.load(tok.path, tokenizers.WORDPIECE, lower_case=True)
  pipeline.create_train_iterator(c, tok2, wd)
  assert pipeline.traced_builder.cache_info().misses == builders + 1
  e1 = pipeline.create_eval_batches(c, tok, wd)
  misses = pipeline._eval_batches.cache_info().misses
  e2 = pipeline.create_eval_batches(c, tok2, wd)  # same tokenizer file: cached
  assert pipeline._eval_batches.cache_info().misses == misses
  assert e1[0] is not e2[0] and e1[0]["input_ids"] is e2[0]["input_ids"]
  c.data.num_eval_batches = 1
  assert len(pipeline.create_eval_batches(c, tok, wd)) == 1


def _corpus_with_bad_lines(uniq, path, every=10):
  """The first 300 documents, every `every`-th line with an invalid byte."""
  lines = []
  for doc in uniq["docs"][:300]:
    lines.extend(s.encode() for s in doc)
    lines.append(b"")
  for i in range(0, len(lines), every):
    if lines[i]:
      lines[i] = lines[i] + b" \xff"
  path.write_bytes(b"\n".join(lines) + b"\n")
  return sum(1 for l in lines if b"\xff" in l), len(lines)


@pytest.mark.slow
def test_data_counters_are_real_from_the_first_batch(uniq, tmp_path, caplog):
  tok = uniq["tok"]
  path = tmp_path / "some_bad.txt"
  n_bad, _ = _corpus_with_bad_lines(uniq, path)
  c = make_config(str(path), tok.path)  # shuffled (buffer 64), 256-line blocks
  it = pipeline.create_train_iterator(c, tok, str(tmp_path))
  with caplog.at_level("INFO"):
    next(it)
  # Every example carries its share of its block's counts, so the first
  # batch already counts lines (not only a block's first example).
  assert it.stats["examples"] == 16 and it.stats["lines"] > 0, it.stats
  assert 0 < it.stats["invalid_utf8_lines"] < it.stats["lines"], it.stats
  warnings = [r.getMessage() for r in caplog.records
              if r.levelname == "WARNING" and "lines read from" in
              r.getMessage()]
  assert len(warnings) == 1, caplog.text[-2000:]
  assert str(path) in warnings[0] and "invalid_utf8" in warnings[0]
  assert "Data (process 0) so far: lines=" in caplog.text
  for _ in range(9):
    next(it)
  assert it.stats["examples"] == 160
  # The shares of one epoch add up to the corpus' own counts.
  plan = data_sources.plan(c.data, str(tmp_path))
  ds = pipeline.example_dataset(c, tok, plan, epochs=1)
  total = sum(ex[examples.STATS_KEY].numpy().sum(0) for ex in ds.batch(4096))
  st = dict(zip(examples.STATS, total.tolist()))
  assert st["invalid_utf8_lines"] == n_bad, st


def test_clean_data_gives_no_warning(uniq, tmp_path, caplog):
  c = make_config(uniq["glob"], uniq["tok"].path)
  it = pipeline.create_train_iterator(c, uniq["tok"], str(tmp_path))
  with caplog.at_level("WARNING"):
    for _ in range(10):
      next(it)
  assert "lines read from" not in caplog.text


def test_binary_source_is_one_error_naming_it(uniq, tmp_path):
  tok = uniq["tok"]
  (tmp_path / "good.txt").write_text("\n".join(uniq["docs"][0]) + "\n")
  path = tmp_path / "random.bin"
  path.write_bytes(np.random.default_rng(0).bytes(200_000))
  c = make_config(f"{tmp_path / 'good.txt'};{path}", tok.path)
  c.data.sources, c.data.train_files = c.data.train_files, ""
  with pytest.raises(ValueError, match="yields no usable sentences") as e:
    pipeline.create_train_iterator(c, tok, str(tmp_path))
  assert str(path) in str(e.value) and "good.txt" not in str(e.value)


def test_training_run_on_binary_corpus_is_one_error(tmp_path):
  from tests.helpers import failure_lines
  from tests.helpers import in_process
  from tests.helpers import written_files
  path = tmp_path / "random.bin"
  path.write_bytes(np.random.default_rng(1).bytes(100_000))
  r = in_process.run_main(tmp_path / "w", f"--config.data.train_files={path}",
                          "--config.train.num_steps=2")
  lines = failure_lines(r)
  assert "yields no usable sentences" in lines[-1], lines
  assert str(path) in lines[-1], lines
  assert written_files(tmp_path / "w") == []
