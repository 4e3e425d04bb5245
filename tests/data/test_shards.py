"""Pre-tokenized shards (bert_jax/data/pretokenizing.py, shard_format.py,
shard_source.py): the manifest's counts are the corpus's; in the text
order a run from shards reads exactly the batches of a run from the text
files (shuffled, whole-word masked, eval held out); the global order shows
no order bias (a document's place in the corpus does not predict when it
is seen, every window of steps holds each shard's share), where a
sequential reader fails the same check; hosts read disjoint and complete
shares; a saved iterator resumes exactly; shards of another tokenizer or
another block shape are refused in one line before anything is written.

The corpus numbers every word (``w<n>`` in reading order) and the
WordPiece vocabulary holds exactly those words, so a token id tells its
document.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import demo_corpus
from bert_jax.data import features
from bert_jax.data import pipeline
from bert_jax.data import pretokenizing
from bert_jax.data import shard_format
from bert_jax.data import shard_source
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers
from bert_jax.hf import tokenizer_files
from bert_jax.training import start_from
from tests import helpers

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
NUM_DOCS, FILES, BLOCK_LINES = 3000, 4, 4


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """4 text files of numbered words, their WordPiece vocabulary, the
  shards (2 worker processes) and each token id's document position."""
  d = tmp_path_factory.mktemp("shards")
  docs = demo_corpus.synthetic_documents(NUM_DOCS, seed=2, unique_words=True,
                                         sentences=(1, 6), words=(2, 8))
  files = [demo_corpus.write_documents(str(d / f"part-{k}.txt"),
                                       docs[k::FILES]) for k in range(FILES)]
  words = [w for doc in docs for s in doc for w in s.split()]
  vocab = str(d / "vocab.txt")
  tokenizers.save_wordpiece(SPECIALS + words, vocab)
  # Token id -> the document's place in the corpus (file by file, in order).
  place = np.full(len(SPECIALS) + len(words), -1)
  doc_ids = {}
  word = 0
  for di, doc in enumerate(docs):
    for s in doc:
      for _ in s.split():
        doc_ids[len(SPECIALS) + word] = di
        word += 1
  order = [di for k in range(FILES) for di in range(k, NUM_DOCS, FILES)]
  rank = {di: r for r, di in enumerate(order)}
  for token, di in doc_ids.items():
    place[token] = rank[di]
  config = make_config(",".join(files), vocab)
  spec = tokenizer_files.TokenizerSpec("wordpiece", vocab, True)
  manifest = pretokenizing.write_shards(config.data, spec, str(d / "shards"),
                                        workers=2)
  return dict(dir=str(d), files=files, vocab=vocab, docs=docs, place=place,
              manifest=manifest, shards=str(d / "shards"))


def make_config(sources, vocab, **data):
  c = config_lib.get_config("tiny")
  c.model.vocab_size = 60_000
  c.data.update(dict(dict(
      sources=sources, tokenizer_type="wordpiece", tokenizer_path=vocab,
      seq_length=32, max_predictions_per_seq=5, block_lines=BLOCK_LINES,
      eval_fraction=0.1, num_eval_batches=3, nsp=False, objective="packed",
      whole_word_mask=True), **data))
  c.train.update(batch_size=16, seed=5)
  return c


def tok_of(corpus):
  return tokenizers.load(corpus["vocab"], "wordpiece", True)


@pytest.mark.slow
def test_manifest_counts_the_corpus(corpus):
  m = shard_format.read_manifest(corpus["shards"])
  assert m.documents == NUM_DOCS
  words = sum(len(s.split()) for doc in corpus["docs"] for s in doc)
  assert m.tokens == words  # One token per numbered word.
  assert [s.source for s in m.shards] == corpus["files"]
  assert [s.key for s in m.shards] == [data_sources.file_key(f)
                                       for f in corpus["files"]]
  assert m.tokenizer["sha256"] == shard_format.tokenizer_hash(
      corpus["vocab"], "wordpiece", True)
  assert os.path.isfile(m.tokenizer_path)
  blocks = sum(s.blocks for s in m.shards)
  assert blocks > 2000  # Enough blocks to measure an order.


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_files_order_reads_the_batches_of_the_text(corpus, tmp_path, mode):
  tok = tok_of(corpus)
  batches = []
  for sources in (",".join(corpus["files"]), f"shards:{corpus['shards']}"):
    c = make_config(sources, corpus["vocab"], shard_order="files")
    plan = data_sources.plan(c.data, str(tmp_path))
    if mode == "train":
      it = pipeline.create_train_iterator(c, tok, str(tmp_path))
      batches.append([next(it) for _ in range(12)])
    else:
      batches.append(pipeline.create_eval_batches(c, tok, str(tmp_path)))
    del plan
  text, shards = batches
  assert len(text) == len(shards) > 0
  for a, b in zip(text, shards):
    for k in features.pretraining_spec(make_config("", "").data):
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _stream(corpus, tmp_path, epochs=1, process_index=0, process_count=1,
            **data):
  """(document place, shard index) of every example of the shards in
  stream order (no example shuffle; document chunks: each row one
  document's)."""
  tok = tok_of(corpus)
  c = make_config(f"shards:{corpus['shards']}", corpus["vocab"],
                  shuffle_buffer=0, eval_fraction=0.0, packing=True, **data)
  plan = data_sources.plan(c.data, str(tmp_path))
  ds = pipeline.example_dataset(c, tok, plan, process_index, process_count,
                                epochs=epochs)
  sizes = np.cumsum([s.documents for s in corpus["manifest"].shards])
  places = np.asarray([corpus["place"][ex["input_ids"][1]]
                       for ex in ds.as_numpy_iterator()])
  return places, np.searchsorted(sizes, places, side="right")


def order_bias(places, shards, windows=10):
  """(|Spearman correlation| of a document's place in its shard and when
  it is read, the largest gap between a shard's share of a window of the
  stream and its share of the whole)."""
  rank = lambda x: np.argsort(np.argsort(x, kind="stable"), kind="stable")
  within = places - shards * (NUM_DOCS // FILES)  # Each file holds 1/4.
  rho = abs(np.corrcoef(rank(within), np.arange(len(places)))[0, 1])
  share = np.bincount(shards, minlength=FILES) / len(shards)
  gap = max(np.abs(np.bincount(w, minlength=FILES) / len(w) - share).max()
            for w in np.array_split(shards, windows))
  return rho, gap


@pytest.mark.slow
def test_global_order_shows_no_order_bias(corpus, tmp_path):
  places, shards = _stream(corpus, tmp_path)
  assert sorted(set(places)) == list(range(NUM_DOCS))  # All of it.
  rho, gap = order_bias(places, shards)
  print(f"global: |rho| {rho:.3f}, largest share gap {gap:.3f}")
  assert rho < 0.1 and gap < 0.1, (rho, gap)


@pytest.mark.slow
@pytest.mark.parametrize("cycle", [1, 8])
def test_the_bias_check_fails_a_sequential_reader(corpus, tmp_path, cycle):
  """The text order reads each file in order: one file at a time
  (cycle_length 1) or all four interleaved; both are seen by the check."""
  places, shards = _stream(corpus, tmp_path, shard_order="files",
                           cycle_length=cycle)
  rho, gap = order_bias(places, shards)
  print(f"files, cycle {cycle}: |rho| {rho:.3f}, largest share gap {gap:.3f}")
  assert rho > 0.5 or gap > 0.5, (rho, gap)


@pytest.mark.slow
def test_each_epoch_reads_another_order_of_the_same_blocks(corpus, tmp_path):
  places, _ = _stream(corpus, tmp_path, epochs=2)
  half = len(places) // 2
  assert sorted(places[:half]) == sorted(places[half:])
  assert not np.array_equal(places[:half], places[half:])


@pytest.mark.slow
def test_hosts_read_disjoint_complete_shares(corpus, tmp_path):
  ours = [_stream(corpus, tmp_path, process_index=i, process_count=2)[0]
          for i in range(2)]
  every, _ = _stream(corpus, tmp_path)
  assert min(map(len, ours)) > 0.3 * len(every)
  assert sorted(np.concatenate(ours)) == sorted(every)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4099])
def test_permute_is_a_permutation(n):
  keys = shard_source.epoch_keys(tf.constant([1, 2], tf.int64), 3)
  # In a tf.data map, as the pipeline calls it (graph mode, not eager).
  got = [int(x) for x in tf.data.Dataset.range(n).map(
      lambda i: shard_source.permute(i, n, keys)).as_numpy_iterator()]
  assert sorted(got) == list(range(n))
  if n >= 64:
    assert abs(np.corrcoef(got, np.arange(n))[0, 1]) < 0.2


@pytest.mark.slow
def test_saved_iterator_resumes_exactly(corpus, tmp_path):
  tok = tok_of(corpus)
  c = make_config(f"shards:{corpus['shards']}", corpus["vocab"])
  helpers.assert_train_iterator_resumes_exactly(c, tok, tmp_path,
                                                saved_after=4, compared=4)


@pytest.mark.slow
def test_run_takes_the_shards_tokenizer(corpus, tmp_path):
  c = make_config(f"shards:{corpus['shards']}", "")
  data = start_from.resolve(c, str(tmp_path / "run")).data
  assert (data.tokenizer_type, data.tokenizer_path) == (
      "wordpiece", corpus["manifest"].tokenizer_path)


@pytest.mark.slow
def test_shards_of_another_tokenizer_are_refused(corpus, tmp_path):
  from bert_jax.training import trainer as trainer_lib
  other = str(tmp_path / "vocab.txt")
  with open(corpus["vocab"]) as f:
    lines = f.read().splitlines()
  tokenizers.save_wordpiece(lines + ["extra"], other)
  c = make_config(f"shards:{corpus['shards']}", other)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    trainer_lib.train_and_evaluate(c, str(workdir))
  message = str(e.value)
  assert message.startswith(
      f"data.sources: shards:{corpus['shards']} were tokenized with "
      "tokenizer/vocab.txt (wordpiece, sha256 "), message
  assert f"not the run's tokenizer {other} (sha256 " in message
  assert len(message.splitlines()) == 1
  assert not workdir.exists()


@pytest.mark.slow
def test_shards_of_another_block_shape_are_refused(corpus, tmp_path):
  c = make_config(f"shards:{corpus['shards']}", "", block_lines=1024)
  with pytest.raises(ValueError, match=(
      r"^data.sources: shards:.* were cut with data.block_lines=4, but the "
      r"config has data.block_lines=1024; set "
      r"--config.data.block_lines=4.$")):
    start_from.resolve(c, str(tmp_path / "run"))


def test_a_directory_without_a_manifest_is_refused(tmp_path):
  c = make_config(f"shards:{tmp_path}", "")
  with pytest.raises(ValueError, match=(
      rf"^data.sources: shards:{tmp_path} has no manifest.json \(not made by "
      r"python -m bert_jax.pretokenize, or not finished\).$")):
    start_from.resolve(c, str(tmp_path / "run"))
