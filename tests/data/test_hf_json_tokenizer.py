"""Any Hugging Face tokenizer.json as a run's tokenizer
(bert_jax/data/hf_json_tokenizer.py), for a byte-level BPE trained here
with RoBERTa's special tokens, a SentencePiece Unigram in XLM-R's layout
and a WordPiece: the pipeline's rows hold the ids transformers' tokenizer
gives on real text (accents, CJK, emoji, URLs, control characters) between
the tokenizer's own <s> / </s> or [CLS] / [SEP]; the special tokens are
read from the tokenizer; whole-word masking never splits a word's pieces;
the iterator of a pipeline running it resumes exactly; a tokenizer without
a mask token is refused naming what it lacks."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import masking
from bert_jax.data import pipeline
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers
from bert_jax.training import config_checks
from tests import helpers
from tests.helpers import tokenizer_dirs

transformers = pytest.importorskip("transformers")
KINDS = tokenizer_dirs.KINDS


@pytest.fixture(scope="module")
def made(tmp_path_factory):
  base = tmp_path_factory.mktemp("hf_json")
  out = {}
  for kind in KINDS:
    path = tokenizer_dirs.BUILDERS[kind](str(base / kind))
    out[kind] = dict(path=path, tok=tokenizers.load(path, tokenizers.HF_JSON),
                     hf=transformers.AutoTokenizer.from_pretrained(
                         os.path.dirname(path)))
  return out


def hf_ids(hf, text):
  return hf(text, add_special_tokens=False)["input_ids"]


def config_for(path, text_glob, seq_length=256, **data):
  c = config_lib.get_config("tiny")
  c.data.update(dict(dict(
      train_files=text_glob, tokenizer_type="hf_json", tokenizer_path=path,
      seq_length=seq_length, max_predictions_per_seq=20, eval_fraction=0.0,
      shuffle_buffer=0, nsp=False, objective="packed"), **data))
  c.train.update(batch_size=2, seed=1)
  return c


@pytest.mark.parametrize("kind", KINDS)
def test_pipeline_rows_hold_transformers_ids(made, kind, tmp_path):
  """One document of TEXT through the pipeline (document chunks, no
  shuffle): the rows are <s> ids </s> (the tokenizer's own specials) and
  their ids, in order, are transformers' for each line."""
  tok, hf = made[kind]["tok"], made[kind]["hf"]
  text = str(tmp_path / "text.txt")
  with open(text, "w", encoding="utf-8") as f:
    f.write("\n".join(tokenizer_dirs.TEXT) + "\n")
  c = config_for(made[kind]["path"], text, packing=True)
  plan = data_sources.plan(c.data, str(tmp_path))
  rows = list(pipeline.example_dataset(c, tok, plan, epochs=1)
              .as_numpy_iterator())
  got = []
  for row in rows:
    ids = row["input_ids"][row["input_mask"] > 0].tolist()
    assert ids[0] == hf.cls_token_id and ids[-1] == hf.sep_token_id
    got += ids[1:-1]
  want = [i for line in tokenizer_dirs.TEXT for i in hf_ids(hf, line)]
  assert got == want
  # Line by line too, with the tokenizer's own host-side calls.
  assert tok.tokenize(tf.constant(list(tokenizer_dirs.TEXT))).to_list() == [
      hf_ids(hf, line) for line in tokenizer_dirs.TEXT]


@pytest.mark.parametrize("kind", KINDS)
def test_special_tokens_come_from_the_tokenizer(made, kind):
  tok, hf = made[kind]["tok"], made[kind]["hf"]
  assert (tok.cls_id, tok.sep_id, tok.pad_id, tok.mask_id, tok.unk_id) == (
      hf.cls_token_id, hf.sep_token_id, hf.pad_token_id, hf.mask_token_id,
      hf.unk_token_id)
  assert set(hf.all_special_ids) <= set(tok.special_ids)
  assert not tok.missing_special_tokens
  assert tok.vocab_size == len(hf)


def _words_split(hf, tok, selected, rows) -> int:
  """How many of transformers' words (its word_ids) have some pieces
  selected and others not."""
  split = 0
  for r, line in enumerate(rows):
    word_ids = hf(line, add_special_tokens=False).word_ids()
    sel = selected[r, 1:1 + len(word_ids)]
    for w in set(word_ids):
      picked = {bool(s) for s, x in zip(sel, word_ids) if x == w}
      split += len(picked) > 1
  return split


@pytest.mark.parametrize("kind", KINDS)
def test_whole_word_masking_never_splits_a_word(made, kind):
  """Over 20 masks of every TEXT line (half the tokens selected), no word
  of transformers' pre-tokenizer has some pieces selected and others not;
  token-level masking does split them (the check sees a split)."""
  tok, hf = made[kind]["tok"], made[kind]["hf"]
  lines = list(tokenizer_dirs.TEXT)
  t = 2 + max(len(hf_ids(hf, line)) for line in lines)
  ids = np.full((len(lines), t), tok.pad_id, np.int32)
  for r, line in enumerate(lines):
    row = [tok.cls_id] + hf_ids(hf, line) + [tok.sep_id]
    ids[r, :len(row)] = row
  assert (~tok.word_start[ids[ids != tok.pad_id]]).sum() > 20  # Continuations.
  real = (ids != tok.pad_id).sum() - 2 * len(lines)

  def splits(whole_word):
    masker = masking.Masker(
        vocab_size=tok.vocab_size, special_ids=tok.special_ids,
        mask_id=tok.mask_id, max_predictions=t, mask_rate=0.5,
        whole_word=whole_word, word_start=tok.word_start)
    total = 0
    for seed in range(20):
      out = masker(tf.constant(ids), tf.constant([seed, 7], tf.int64))
      selected = np.zeros(ids.shape, bool)
      pos, w = out["masked_lm_positions"].numpy(), out[
          "masked_lm_weights"].numpy()
      for r in range(len(lines)):
        selected[r, pos[r][w[r] > 0]] = True
      # Up to half (a long word that does not fit the budget is skipped).
      assert selected.sum() > 0.2 * real
      total += _words_split(hf, tok, selected, lines)
    return total

  assert splits(True) == 0
  assert splits(False) > 0


def test_host_side_pipeline_resumes_exactly(made, tmp_path):
  """A saved iterator of a pipeline tokenizing with the byte-level BPE
  (a host-side call in the graph) continues with the same batches."""
  from bert_jax.data import demo_corpus
  tok = made["byte_level_bpe"]["tok"]
  train_glob, _ = demo_corpus.write_demo_corpus(str(tmp_path / "demo"))
  c = config_for(made["byte_level_bpe"]["path"], train_glob, seq_length=64,
                 shuffle_buffer=32, whole_word_mask=True)
  c.train.batch_size = 8
  helpers.assert_train_iterator_resumes_exactly(c, tok, tmp_path,
                                                saved_after=3, compared=3)


def test_a_tokenizer_without_a_mask_token_is_refused(made, tmp_path):
  spec = json.load(open(made["byte_level_bpe"]["path"], encoding="utf-8"))
  spec["added_tokens"] = [t for t in spec["added_tokens"]
                          if t["content"] != "<mask>"]
  spec["model"]["vocab"].pop("<mask>", None)
  d = tmp_path / "no_mask"
  d.mkdir()
  (d / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
  tok = tokenizers.load(str(d / "tokenizer.json"), tokenizers.HF_JSON)
  assert tok.mask_id is None
  config = config_lib.get_config("tiny")
  with pytest.raises(ValueError, match=(
      r"^Tokenizer .*no_mask/tokenizer.json lacks the special token\(s\) "
      r"\[MASK\] / <mask>\.$")):
    config_checks.check_tokenizer(config, tok)


def test_a_file_that_is_no_tokenizer_json_is_one_line(tmp_path):
  path = tmp_path / "tokenizer.json"
  path.write_text('{"model": {"type": "Nothing"}}', encoding="utf-8")
  with pytest.raises(ValueError, match=(
      r"^data.tokenizer_path='.*tokenizer.json' is not a tokenizer.json the "
      r"tokenizers library reads \(")) as e:
    tokenizers.load(str(path), tokenizers.HF_JSON)
  assert len(str(e.value).splitlines()) == 1
