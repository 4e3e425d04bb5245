"""Fine-tuning data: GLUE (mocked TFDS), user files, encoding, buckets, resume.

The tokenizer is a WordPiece vocabulary of the words ``w0 .. w299`` after the
five special tokens, so ``w<k>`` has id ``k + 5`` and every expected batch can
be written down from the text.
"""

import json
import logging

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from bert_jax.data import feature_batches
from bert_jax.data import features
from bert_jax.data import task_data
from bert_jax.data import task_sources
from bert_jax.data import tokenizers

PAD, UNK, CLS, SEP = 0, 1, 2, 3
NWORDS = 300


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("tok") / "vocab.txt")
  tokenizers.save_wordpiece(
      ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
      [f"w{i}" for i in range(NWORDS)], path)
  return tokenizers.load(path, tokenizers.WORDPIECE, lower_case=True)


def ids(text):
  return [int(w[1:]) + 5 for w in text.replace(",", "").split()]


def expected(a, b, seq_length):
  """[CLS] A [SEP] (B [SEP]) by google-research/bert's own procedure."""
  ta, tb = ids(a), (ids(b) if b is not None else None)
  if tb is None:
    ta = ta[:seq_length - 2]
    return [CLS] + ta + [SEP], [0] * (len(ta) + 2)
  task_data.truncate_seq_pair(ta, tb, seq_length - 3)
  return ([CLS] + ta + [SEP] + tb + [SEP],
          [0] * (len(ta) + 2) + [1] * (len(tb) + 1))


def random_rows(n, pair, seed=0, max_words=80, regression=False):
  rng = np.random.default_rng(seed)
  text = lambda: " ".join(f"w{i}" for i in rng.integers(
      0, NWORDS, rng.integers(1, max_words)))
  a = np.array([text() for _ in range(n)], object)
  b = np.array([text() for _ in range(n)], object) if pair else None
  labels = (rng.normal(size=n).astype(np.float32) if regression else
            rng.integers(0, 3, n).astype(np.int32))
  return task_sources.Rows(a, b, labels, np.arange(n, dtype=np.int64))


# -----------------------------------------------------------------------------
# Encoding and truncation.
# -----------------------------------------------------------------------------


def test_truncated_lengths_equal_google_truncate_seq_pair():
  grid = [(la, lb, m) for la in range(13) for lb in range(13)
          for m in range(1, 14)]
  la, lb, m = (np.array(x) for x in zip(*grid))
  for budget in range(1, 14):
    sel = m == budget
    got_a, got_b = task_data.truncated_lengths(tf.constant(la[sel]),
                                        tf.constant(lb[sel]), budget)
    for x, y, ga, gb in zip(la[sel], lb[sel], got_a.numpy(), got_b.numpy()):
      ta, tb = list(range(x)), list(range(y))
      task_data.truncate_seq_pair(ta, tb, budget)
      assert (ga, gb) == (len(ta), len(tb)), (x, y, budget)


def test_longest_first_truncation_on_a_hand_made_pair(tok):
  out = task_data.encode(tok, 8, tf.constant(["w1 w2 w3 w4 w5 w6", "w1 w2 w3 w4"]),
                  tf.constant(["w7 w8", "w5 w6 w7 w8"]))
  got = out["input_ids"].to_list()
  # Budget 8 - 3 = 5. Row 0: A is longer, A loses w4 w5 w6 -> (3, 2).
  # Row 1: (4,4) -> B pops on ties -> (4,3) -> A (3,3) -> B (3,2).
  w = lambda k: k + 5
  assert got[0] == [CLS, w(1), w(2), w(3), SEP, w(7), w(8), SEP]
  assert got[1] == [CLS, w(1), w(2), w(3), SEP, w(5), w(6), SEP]
  assert out["segment_ids"].to_list()[0] == [0, 0, 0, 0, 0, 1, 1, 1]
  single = task_data.encode(tok, 5, tf.constant(["w1 w2 w3 w4"]))
  assert single["input_ids"].to_list() == [[CLS, w(1), w(2), w(3), SEP]]
  assert single["segment_ids"].to_list() == [[0] * 5]


def test_bucket_lengths():
  """Every task kind's batch lengths (feature_batches' home)."""
  assert feature_batches.bucket_lengths(128) == (32, 64, 128)
  assert feature_batches.bucket_lengths(48) == (32, 48)
  assert feature_batches.bucket_lengths(512, (64, 128)) == (64, 128, 512)
  with pytest.raises(ValueError, match="seq_length"):
    feature_batches.bucket_lengths(2)


# -----------------------------------------------------------------------------
# Eval batches: buckets, every example once, padding weight 0.
# -----------------------------------------------------------------------------


def check_batch_rows(batch, rows, seq_length, allowed):
  """Every weighted row equals its hand-built encoding in the right bucket."""
  t = batch["input_ids"].shape[1]
  assert t in allowed
  for r in range(batch["input_ids"].shape[0]):
    if batch["example_weights"][r] == 0:
      assert batch["example_index"][r] == -1
      assert batch["input_mask"][r].sum() == 0
      continue
    i = batch["example_index"][r]
    want, seg = expected(rows.text_a[i], None if rows.text_b is None
                         else rows.text_b[i], seq_length)
    n = len(want)
    assert t == min(x for x in allowed if x >= n)  # the smallest that fits
    np.testing.assert_array_equal(batch["input_ids"][r], want + [PAD] * (t - n))
    np.testing.assert_array_equal(batch["segment_ids"][r], seg + [0] * (t - n))
    np.testing.assert_array_equal(batch["input_mask"][r],
                                  [1] * n + [0] * (t - n))
    assert batch["labels"][r] == rows.labels[i]


@pytest.mark.slow
@pytest.mark.parametrize("pair", [False, True])
def test_eval_every_example_exactly_once_in_static_buckets(tok, pair):
  rows = random_rows(203, pair, seed=1)
  kw = dict(seq_length=96, batch_size=8, buckets=(16, 32, 64))
  batches = task_data.eval_batches(rows, tok, **kw)
  allowed = (16, 32, 64, 96)
  seen = []
  short = {}
  for b in batches:
    assert b["input_ids"].shape[0] == 8
    for k, (dims, dtype) in features.CLASSIFICATION.items():
      assert b[k].dtype == dtype and b[k].ndim == 1 + len(dims), k
    check_batch_rows(b, rows, 96, allowed)
    w = b["example_weights"]
    seen += b["example_index"][w > 0].tolist()
    if (w == 0).any():  # padding only in the last batch of a bucket
      t = b["input_ids"].shape[1]
      assert t not in short
      short[t] = True
      assert (w[:int(w.sum())] == 1).all() and (w[int(w.sum()):] == 0).all()
  assert sorted(seen) == list(range(len(rows)))
  assert len({b["input_ids"].shape[1] for b in batches}) > 2  # buckets used
  again = task_data.eval_batches(rows, tok, **kw)  # deterministic order
  assert len(again) == len(batches)
  assert all(np.array_equal(x[k], y[k]) for x, y in zip(batches, again)
             for k in x)


def test_regression_labels_are_float(tok):
  rows = random_rows(20, True, regression=True)
  b = task_data.eval_batches(rows, tok, seq_length=32, batch_size=8)[0]
  assert b["labels"].dtype == features.REGRESSION["labels"][1] == np.float32
  w = b["example_weights"] > 0
  np.testing.assert_array_equal(b["labels"][w],
                                rows.labels[b["example_index"][w]])


# -----------------------------------------------------------------------------
# Training batches: shuffled, full, resumable, split across hosts.
# -----------------------------------------------------------------------------


def take(ds, n):
  return [{k: v.numpy() for k, v in b.items()} for b in ds.take(n)]


@pytest.mark.slow
def test_train_batches_full_shuffled_and_cover_each_epoch(tok):
  rows = random_rows(50, True, seed=2)
  kw = dict(seq_length=64, batch_size=8, seed=3, buckets=(16, 32),
            with_index=True)
  batches = take(task_data.train_dataset(rows, tok, **kw), 30)  # 240 = 4.8 epochs
  counts = np.zeros(50, int)
  for b in batches:
    assert (b["example_weights"] == 1).all() and b["input_ids"].shape[0] == 8
    check_batch_rows(b, rows, 64, (16, 32, 64))
    np.add.at(counts, b["example_index"], 1)
  # Each epoch is a permutation; at most 3 buckets x 7 rows wait unbatched.
  assert counts.min() >= 2 and counts.max() <= 6, counts
  order = np.concatenate([b["example_index"] for b in batches])
  same = np.concatenate([b["example_index"] for b in
                         take(task_data.train_dataset(rows, tok, **kw), 30)])
  other = np.concatenate([b["example_index"] for b in take(
      task_data.train_dataset(rows, tok, **dict(kw, seed=4)), 30)])
  np.testing.assert_array_equal(order, same)
  assert (order != other).mean() > 0.5
  # One bucket: batches follow the row order, each epoch a new permutation.
  short = random_rows(48, False, seed=5, max_words=10)
  one = take(task_data.train_dataset(short, tok, seq_length=32, batch_size=8,
                              seed=3, buckets=(32,), with_index=True), 12)
  order = np.concatenate([b["example_index"] for b in one])
  epoch1, epoch2 = order[:48], order[48:]
  assert sorted(epoch1) == sorted(epoch2) == list(range(48))
  assert (epoch1 != epoch2).mean() > 0.5 and (epoch1 != np.arange(48)).any()
  assert "example_index" not in take(task_data.train_dataset(
      rows, tok, **dict(kw, with_index=False)), 1)[0]


def test_train_iterator_save_restore_continues_exactly(tok, tmp_path):
  rows = random_rows(50, False, seed=3)
  kw = dict(seq_length=64, batch_size=8, seed=5, buckets=(16, 32))
  it = task_data.create_train_iterator(rows, tok, **kw)
  for _ in range(4):
    next(it)
  it.save(str(tmp_path))
  want = [next(it) for _ in range(12)]  # crosses epoch boundaries
  fresh = task_data.create_train_iterator(rows, tok, **kw)
  first = next(fresh)
  fresh.restore(str(tmp_path))
  got = [next(fresh) for _ in range(12)]
  assert not all(np.array_equal(first[k], want[0][k]) for k in first)
  for a, b in zip(want, got):
    assert set(a) == set(b)
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_hosts_get_disjoint_slices_of_the_same_global_batch(tok, mode):
  rows = random_rows(41, True, seed=4)
  kw = dict(seq_length=64, batch_size=8, buckets=(16, 32))
  if mode == "train":
    make = lambda **h: take(task_data.train_dataset(rows, tok, seed=1, **kw, **h), 6)
  else:
    make = lambda **h: task_data.eval_batches(rows, tok, **kw, **h)
  whole = make()
  parts = [make(process_index=i, process_count=2) for i in range(2)]
  assert len(parts[0]) == len(parts[1]) == len(whole)
  for g, h0, h1 in zip(whole, *parts):
    for k in g:
      assert h0[k].shape[0] == 4
      np.testing.assert_array_equal(np.concatenate([h0[k], h1[k]]), g[k])
  with pytest.raises(ValueError, match="divisible"):
    make(process_index=0, process_count=3)


# -----------------------------------------------------------------------------
# The user's files.
# -----------------------------------------------------------------------------

# Each text's label is fixed by its words, so a shifted label is visible.
LABEL_OF = {"w1 w2": "pos", "w3": "neg", "w6, w7": "neg", "w10": "neutral",
            "w11 w12": "pos", "w3\u2028w4": "neg"}


def write(path, text):
  with open(path, "w") as f:
    f.write(text)
  return str(path)


def check_labels_not_shifted(rows, names):
  for a, lab in zip(rows.text_a, rows.labels):
    assert names[lab] == LABEL_OF[a], (a, names[lab])


def test_csv_with_bad_rows_counted_and_labels_kept(tmp_path, caplog):
  path = write(tmp_path / "train.csv", "\n".join([
      "text,label,note",
      "w1 w2,pos,a",
      "w3,neg,b",
      ",pos,c",               # missing text
      "w4 w5,,d",             # missing label
      '"w6, w7",neg,e',       # quoted comma: one field
      "w8,pos",               # too few columns
      "w9,pos,f,g",           # too many columns
      "w10,neutral,h",
      "",
      "w11 w12,pos,i"]) + "\n")
  with caplog.at_level(logging.WARNING):
    rows, names = task_sources.read_file(path, "text", "label")
  assert names == ["neg", "neutral", "pos"]  # sorted, from the train file
  assert list(rows.text_a) == ["w1 w2", "w3", "w6, w7", "w10", "w11 w12"]
  check_labels_not_shifted(rows, names)
  assert rows.bad == dict(bad_lines=0, wrong_column_count=2, missing_text=1,
                          missing_label=1, unknown_label=0)
  assert list(rows.index) == [0, 1, 4, 7, 9]  # data row numbers in the file
  assert "train.csv" in caplog.text and "wrong_column_count=2" in caplog.text
  # Line separators inside a field (U+2028, a quoted newline) stay in it;
  # a byte-order mark (Excel's CSV export) is not part of the first column.
  odd = write(tmp_path / "odd.csv", '\ufefftext,label\n"w1\u2028w2",pos\n'
              '"w3\nw4",neg\nw5,pos\n')
  rows_odd, _ = task_sources.read_file(odd, "text", "label")
  assert list(rows_odd.text_a) == ["w1\u2028w2", "w3\nw4", "w5"]
  assert rows_odd.labels.tolist() == [1, 0, 1]
  first, names2 = task_sources.read_file(path, "text", "label", label_order="first_seen")
  assert names2 == ["pos", "neg", "neutral"]
  check_labels_not_shifted(first, names2)


def test_tsv_pair_task_with_unknown_validation_label(tmp_path, tok):
  header = "sentence1\tsentence2\tlabel\n"
  train = write(tmp_path / "train.tsv", header +
                "w1 w2\tw3\tpos\nw3\tw4 \"w5\tneg\nw10\tw11\tneutral\n"
                "w1 w2\n\tw2\tpos\n")
  valid = write(tmp_path / "dev.tsv", header +
                "w3\tw1\tneg\nw1 w2\tw2\tmaybe\nw11 w12\tw13\tpos\n")
  spec, rows = task_sources.read_user_task(
      train, valid, "sentence1", "label", "sentence2",
      label_dir=str(tmp_path / "run"))
  assert spec.is_pair and spec.label_names == ("neg", "neutral", "pos")
  assert spec.metrics == ("accuracy",) and spec.num_labels == 3
  tr, va = rows["train"], rows["validation"]
  assert tr.bad["wrong_column_count"] == 1 and tr.bad["missing_text"] == 1
  assert list(tr.text_b) == ["w3", 'w4 "w5', "w11"]  # quotes kept in TSV
  check_labels_not_shifted(tr, spec.label_names)
  assert va.bad["unknown_label"] == 1 and len(va) == 2
  check_labels_not_shifted(va, spec.label_names)
  saved = json.load(open(tmp_path / "run" / task_sources.LABEL_MAP_FILE))
  assert saved == {"label2id": {"neg": 0, "neutral": 1, "pos": 2}}
  # The encoded pair: [CLS] w3 [SEP] w1 [SEP] with labels from the map.
  b = task_data.eval_batches(va, tok, seq_length=32, batch_size=4)[0]
  np.testing.assert_array_equal(b["input_ids"][0, :5], [CLS, 8, SEP, 6, SEP])
  np.testing.assert_array_equal(b["segment_ids"][0, :5], [0, 0, 0, 1, 1])


def test_jsonl_and_saved_label_map_wins_on_resume(tmp_path):
  lines = [json.dumps({"text": "w1 w2", "label": "pos"}),
           '{"text": "w3\u2028w4", "label": "neg"}',  # raw U+2028 in a line
           '{"text": "w3", "label": ',           # unparseable
           "[1, 2]",                              # not an object
           json.dumps({"label": "pos"}),          # missing text
           json.dumps({"text": "w4", "label": None}),
           json.dumps({"text": "w3", "label": "neg"}),
           json.dumps({"text": "w10", "label": "neutral"})]
  train = write(tmp_path / "train.jsonl", "\n".join(lines) + "\n")
  run = str(tmp_path / "run")
  spec, rows = task_sources.read_user_task(train, "", "text", "label", label_dir=run,
                                 label_order="first_seen")
  assert spec.label_names == ("pos", "neg", "neutral")
  assert rows["train"].bad == dict(bad_lines=2, wrong_column_count=0,
                                   missing_text=1, missing_label=1,
                                   unknown_label=0)
  check_labels_not_shifted(rows["train"], spec.label_names)
  # A resumed run whose train file starts with another label keeps the ids.
  train2 = write(tmp_path / "train2.jsonl", "\n".join(lines[::-1]) + "\n")
  spec2, rows2 = task_sources.read_user_task(train2, "", "text", "label", label_dir=run,
                                   label_order="first_seen")
  assert spec2.label_names == spec.label_names
  check_labels_not_shifted(rows2["train"], spec2.label_names)
  assert task_sources.load_label_map(run) == ["pos", "neg", "neutral"]


def test_integer_string_labels_sort_numerically_and_regression(tmp_path):
  train = write(tmp_path / "t.jsonl", "".join(
      json.dumps({"t": f"w{i}", "y": y}) + "\n"
      for i, y in enumerate([10, 2, 1, 2])))
  rows, names = task_sources.read_file(train, "t", "y")
  assert names == ["1", "2", "10"] and rows.labels.tolist() == [2, 1, 0, 1]
  reg = write(tmp_path / "r.csv", "t,y\nw1,0.5\nw2,abc\nw3,4\n")
  spec, rr = task_sources.read_user_task(reg, "", "t", "y", regression=True)
  assert spec.regression and spec.num_labels == 1
  assert spec.metrics == ("pearson", "spearman")
  assert rr["train"].labels.tolist() == [0.5, 4.0]
  assert rr["train"].labels.dtype == np.float32
  assert rr["train"].bad["missing_label"] == 1


def test_user_file_errors_name_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.csv"):
    task_sources.read_file(str(tmp_path / "nope.csv"), "text", "label")
  path = write(tmp_path / "x.csv", "sentence,label\nw1,a\n")
  with pytest.raises(ValueError, match="no column.*'text'"):
    task_sources.read_file(path, "text", "label")
  with pytest.raises(ValueError, match=r"\.csv, \.tsv or \.jsonl"):
    task_sources.read_file(write(tmp_path / "x.txt", "a"), "text", "label")


# -----------------------------------------------------------------------------
# GLUE through TFDS (mocked: nothing is downloaded).
# -----------------------------------------------------------------------------

GLUE_ROWS = {
    "sst2": {"sentence": ["w1 w2 w3", "w4", "w5 w6"], "label": [1, 0, 1]},
    "mrpc": {"sentence1": ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10", "w2", "w3 w4"],
             "sentence2": ["w20 w21", "w22 w23", "w24"], "label": [0, 1, 1]},
}


def fake_glue(self, split, **unused):
  rows = dict(GLUE_ROWS[self.builder_config.name])
  rows["label"] = np.array(rows["label"], np.int64)
  rows["idx"] = np.arange(len(rows["label"]), dtype=np.int32)
  return tf.data.Dataset.from_tensor_slices(rows)


def test_registry_matches_tfds_glue_features():
  assert len(task_sources.GLUE) == 9
  for name, spec in task_sources.GLUE.items():
    info = tfds.builder(name).info
    for k in spec.text_keys + (spec.label_key,):
      assert k in info.features, (name, k)
    label = info.features["label"]
    assert spec.label_names == tuple(getattr(label, "names", ())), name
    assert spec.regression == (name == "glue/stsb")
  assert task_sources.glue_task("sst2") is task_sources.GLUE["glue/sst2"]
  with pytest.raises(ValueError, match="not a GLUE task"):
    task_sources.glue_task("glue/squad")


@pytest.mark.parametrize("name", ["sst2", "mrpc"])
def test_glue_mock_batches(tok, tmp_path, name):
  spec = task_sources.glue_task(name)
  with tfds.testing.mock_data(as_dataset_fn=fake_glue):
    rows = task_sources.read_glue(spec, "validation", str(tmp_path))
  src = GLUE_ROWS[name]
  assert rows.labels.tolist() == src["label"] and rows.labels.dtype == np.int32
  batches = task_data.eval_batches(rows, tok, seq_length=12, batch_size=4,
                            buckets=(8,))
  assert sorted(i for b in batches for i, w in zip(
      b["example_index"], b["example_weights"]) if w) == [0, 1, 2]
  for b in batches:
    check_batch_rows(b, rows, 12, (8, 12))
  if name == "mrpc":  # the 10 + 2 pair is truncated longest-first to 9
    row0 = [b for b in batches if 0 in b["example_index"]][0]
    r = list(row0["example_index"]).index(0)
    assert row0["input_ids"][r].tolist() == (
        [CLS] + ids("w1 w2 w3 w4 w5 w6 w7") + [SEP] + ids("w20 w21") + [SEP])
    assert row0["segment_ids"][r].tolist() == [0] * 9 + [1] * 3


def test_glue_not_prepared_says_how_to_prepare(tmp_path):
  with pytest.raises(FileNotFoundError) as e:
    task_sources.read_glue(task_sources.glue_task("sst2"), "validation", str(tmp_path))
  msg = str(e.value)
  assert str(tmp_path) in msg and "tfds build glue/sst2" in msg


def test_load_task_glue_and_user_files(tmp_path):
  with tfds.testing.mock_data(as_dataset_fn=fake_glue):
    spec, rows = task_sources.load_task("glue/sst2", tfds_data_dir=str(tmp_path))
  assert spec.name == "glue/sst2" and set(rows) == {"train", "validation"}
  assert list(rows["validation"].text_a) == GLUE_ROWS["sst2"]["sentence"]
  train = write(tmp_path / "t.csv", "q,y\nw1 w2,pos\nw3,neg\n")
  spec, rows = task_sources.load_task("mine", train_path=train, validation_path=train,
                            text_field="q", label_field="y")
  assert spec.name == "mine" and spec.label_names == ("neg", "pos")
  assert rows["validation"].labels.tolist() == [1, 0]
  with pytest.raises(ValueError, match="text_field"):
    task_sources.load_task("mine", train_path=train)
