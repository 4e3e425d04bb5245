"""Tokenizers: training, special ids, in-graph vs Python, caching, CLI."""

import os

import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import demo_corpus
from bert_jax.data import tokenizers
from tests import helpers
from tests.helpers import failure_lines
from tests.helpers import run_tool

ROOT = helpers.REPO


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  d = tmp_path_factory.mktemp("tokcorpus")
  docs = demo_corpus.synthetic_documents(300, seed=2)
  path = demo_corpus.write_documents(str(d / "train.txt"), docs)
  return path, [s for doc in docs for s in doc]


def test_sentencepiece_specials_and_soft_limit(corpus, tmp_path):
  _, sents = corpus
  tok = tokenizers.train(tokenizers.SENTENCEPIECE, iter(sents), 30522, True,
                         str(tmp_path / "spm.model"))
  # The corpus cannot fill 30,522 pieces: fewer, no error.
  assert 50 < tok.vocab_size < 30522
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (
      0, 1, 2, 3, 4)
  assert not tok.missing_special_tokens
  assert tok.lower_case
  # In-graph tokenization equals the Python SentencePiece processor.
  got = tok.tokenize(tf.constant(sents[:300])).to_list()
  assert got == [tok.encode(s) for s in sents[:300]]
  assert tok.encode(sents[0].upper()) == tok.encode(sents[0])  # uncased
  ws = tok.word_start
  assert ws.dtype == bool and ws.shape == (tok.vocab_size,)
  assert all(ws[i] == tok.pieces[i].startswith("\u2581")
             for i in range(5, tok.vocab_size) if tok.pieces[i] != "[UNK]")
  ids = [tok.cls_id] + tok.encode("hello world") + [tok.sep_id, tok.pad_id]
  assert tok.decode(ids) == "[CLS] hello world [SEP]"


def test_wordpiece_trained_and_bert_layout(corpus, tmp_path):
  _, sents = corpus
  tok = tokenizers.train(tokenizers.WORDPIECE, iter(sents), 400, True,
                         str(tmp_path / "vocab.txt"))
  assert tok.vocab_size <= 400
  assert tok.pieces[:5] == list(tokenizers.SPECIAL_TOKENS)
  ids = tok.encode(sents[0].upper())
  assert tok.decode(ids) == sents[0].lower().replace(".", " .")
  assert any(p.startswith("##") for p in tok.pieces)
  assert not any(tok.word_start[i] for i, p in enumerate(tok.pieces)
                 if p.startswith("##"))
  # bert-base-uncased layout: specials found by name, [unused*] excluded.
  vocab = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] +
           ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + tok.pieces[5:])
  path = str(tmp_path / "bert_vocab.txt")
  tokenizers.save_wordpiece(vocab, path)
  bert = tokenizers.load(path, tokenizers.WORDPIECE, lower_case=True)
  assert (bert.pad_id, bert.unk_id, bert.cls_id, bert.sep_id, bert.mask_id) == (
      0, 100, 101, 102, 103)
  assert set(range(100)) <= set(bert.special_ids)


def test_load_tokenizer_caches_by_vocab_size(corpus, tmp_path):
  path, _ = corpus
  c = config_lib.get_config("tiny")
  c.data.train_files = path
  c.data.tokenizer_vocab_size = 200
  t1 = tokenizers.load_tokenizer(c.data, str(tmp_path))
  m1 = os.path.getmtime(t1.path)
  t1b = tokenizers.load_tokenizer(c.data, str(tmp_path))
  assert t1b.path == t1.path and os.path.getmtime(t1.path) == m1
  c.data.tokenizer_vocab_size = 250
  t2 = tokenizers.load_tokenizer(c.data, str(tmp_path))
  assert t2.path != t1.path
  assert t1.vocab_size <= 200 and t2.vocab_size <= 250
  c.data.tokenizer_path = str(tmp_path / "nope.model")
  with pytest.raises(ValueError, match="nope.model"):
    tokenizers.load_tokenizer(c.data, str(tmp_path))
  c.data.tokenizer_path = ""
  c.data.tokenizer_type = "bpe"
  with pytest.raises(ValueError, match="tokenizer_type"):
    tokenizers.load_tokenizer(c.data, str(tmp_path))


@pytest.mark.slow
def test_train_tokenizer_tool(corpus, tmp_path):
  path, _ = corpus
  out = str(tmp_path / "wp" / "vocab.txt")
  r = run_tool(
      "train_tokenizer.py",
      f"--config={os.path.join(ROOT, 'bert_jax', 'config_lib.py')}:tiny",
      f"--config.data.train_files={path}",
      "--config.data.tokenizer_type=wordpiece",
      "--config.data.tokenizer_vocab_size=300", f"--output={out}",
      timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  tok = tokenizers.load(out, tokenizers.WORDPIECE)
  assert 100 < tok.vocab_size <= 300 and not tok.missing_special_tokens


@pytest.mark.slow
def test_train_tokenizer_tool_on_blank_corpus_says_so(tmp_path):
  # Before: SentencePiece's internal "!sentences_.empty()" and a traceback.
  blank = tmp_path / "blank.txt"
  blank.write_text("\n   \n\t\n" * 200)
  out = tmp_path / "tok" / "spm.model"
  r = run_tool(
      "train_tokenizer.py",
      f"--config={os.path.join(ROOT, 'bert_jax', 'config_lib.py')}:tiny",
      f"--config.data.train_files={blank}",
      "--config.data.tokenizer_vocab_size=300", f"--output={out}",
      f"--workdir={tmp_path / 'w'}", timeout=300)
  lines = failure_lines(r)
  assert str(blank) in lines[-1] and "blank" in lines[-1], lines
  assert not (tmp_path / "tok").exists()  # nothing written


def test_tokenizer_training_cuts_long_lines_like_the_pipeline(tmp_path):
  # One 20,000-byte line: longer than SentencePiece's default 16,384-byte
  # limit, which dropped it and then failed with "!sentences_.empty()".
  words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]
  line = " ".join(words[i % 7] + str(i % 13) for i in range(3000))[:19_999] + "x"
  assert len(line.encode()) == 20_000
  path = tmp_path / "long.txt"
  path.write_text("\n\n" + line + "\n   \n")
  c = config_lib.get_config("tiny")
  c.data.train_files = str(path)
  sents = list(tokenizers.training_sentences(c.data, str(tmp_path)))
  assert sents == [line]  # blank lines skipped, 20,000 < max_line_bytes
  tok = tokenizers.train(
      tokenizers.SENTENCEPIECE,
      tokenizers.training_sentences(c.data, str(tmp_path)), 64, True,
      str(tmp_path / "spm.model"), max_line_bytes=int(c.data.max_line_bytes))
  assert tok.vocab_size > 5 + 7 and tok.mask_id == 4
  c.data.max_line_bytes = 1000  # cut to the first 1,000 bytes, as in training
  assert list(tokenizers.training_sentences(c.data, str(tmp_path))) == [
      line.encode()[:1000].decode().strip()]


def test_corrupt_sentencepiece_model_is_one_error_naming_it(corpus, tmp_path):
  _, sents = corpus
  good = tokenizers.train_sentencepiece(iter(sents), 200)
  for name, data in [("truncated.model", good[:len(good) // 2]),
                     ("text.model", b"not a model\n" * 20)]:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError) as e:
      tokenizers.load(str(path), tokenizers.SENTENCEPIECE)
    assert str(e.value).startswith(
        f"{path} is not a readable SentencePiece model"), e.value
    assert "data.tokenizer_path" in str(e.value)


@pytest.mark.slow
def test_train_tokenizer_tool_on_binary_corpus_names_it(tmp_path):
  import numpy as np
  path = tmp_path / "random.bin"
  path.write_bytes(np.random.default_rng(0).bytes(100_000))
  r = run_tool(
      "train_tokenizer.py",
      f"--config={os.path.join(ROOT, 'bert_jax', 'config_lib.py')}:tiny",
      f"--config.data.train_files={path}",
      f"--output={tmp_path / 'tok' / 'spm.model'}",
      f"--workdir={tmp_path / 'w'}", timeout=300)
  lines = failure_lines(r)
  assert "yields no usable sentences" in lines[-1], lines
  assert str(path) in lines[-1], lines
  assert not (tmp_path / "tok").exists()


@pytest.mark.parametrize("case", ["corrupt_model", "blank_corpus"])
def test_training_run_on_bad_tokenizer_input_is_one_error(tmp_path, case):
  from tests.helpers import in_process
  from tests.helpers import written_files
  if case == "corrupt_model":
    bad = tmp_path / "spm.model"
    bad.write_bytes(b"\x0a\x05[PAD]" + bytes(range(200)))
    flag = f"--config.data.tokenizer_path={bad}"
    expected = f"error: {bad} is not a readable SentencePiece model"
  else:
    bad = tmp_path / "blank.txt"
    bad.write_text(" \n\n\t\n" * 100)
    flag = f"--config.data.train_files={bad}"
    expected = "error: No text to train a tokenizer on: every line of"
  r = in_process.run_main(tmp_path / "w", flag, "--config.train.num_steps=2")
  lines = failure_lines(r)
  assert lines[-1].startswith(expected) and str(bad) in lines[-1], lines
  assert written_files(tmp_path / "w") == []
