"""bert_jax.zero_shot: cloze scores are the fill-mask log-probabilities."""

import json

import numpy as np
import pytest

from bert_jax import zero_shot
from bert_jax.downstream import cloze
from bert_jax.downstream import embeddings
from bert_jax.downstream import mask_filling
from tests.helpers import in_process
from tests.helpers import tiny_models

TEMPLATE = "{text} It was [MASK]."
VERBALIZER = {"neg": "terrible", "pos": "great"}
TEXTS = [
    "i loved this movie", "the plot was boring and the acting bad",
    "a fun film", "what a long night", "we watched it",
    "not good", "the story was fine but not very fun", "i hated it",
    "she liked the river bank", "the acting was really nice and the story "
    "was about a long day at the bank with my money and water and cash and "
    "a question about what we did on the river",  # > 32 tokens: 2nd bucket.
    "you saw it", "boring",
]
LABELS = ["pos", "neg", "pos", "neg", "pos", "neg", "pos", "neg", "pos",
          "pos", "neg", "neg"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  return tiny_models.make_hf_dir(str(tmp_path_factory.mktemp("zs")),
                                 neutral_words=("terrible", "great"))


def _by_hand(runner, template, text, text_b=None):
  """log p(word) at [MASK] for each verbalizer word, from fill_mask."""
  filled = cloze.fill(template, text, text_b, "[MASK]")
  rows = runner(filled, top_k=runner.vocab_size)
  p = {r["token_str"]: r["score"] for r in rows}
  return np.log([p[w] for w in VERBALIZER.values()])


@pytest.mark.slow
def test_scores_and_accuracy_equal_fill_mask_by_hand(tiny):
  examples = list(zip(TEXTS, [None] * len(TEXTS), LABELS))
  res = cloze.zero_shot_classify(tiny["out"], examples, TEMPLATE,
                                     VERBALIZER, batch_size=4)
  runner = mask_filling.FillMask(*mask_filling.load(tiny["out"]))
  expected = np.stack([_by_hand(runner, TEMPLATE, t) for t in TEXTS])
  np.testing.assert_allclose(res["scores"], expected, atol=2e-5, rtol=0)
  labels = list(VERBALIZER)
  preds = [labels[j] for j in expected.argmax(1)]
  assert res["predictions"] == preds
  assert res["accuracy"] == pytest.approx(
      np.mean([p == l for p, l in zip(preds, LABELS)]))
  # The context decides (both labels occur), not the output bias alone.
  assert set(preds) == {"neg", "pos"}, preds
  assert res["num_examples"] == len(TEXTS) and res["num_truncated"] == 0


@pytest.mark.slow
def test_pair_template_and_unlabeled_examples(tiny):
  template = "{text} ? [MASK] , {text_b}"
  pairs = [("i loved this movie", "it was fun"),
           ("the plot was boring", "i liked it"), ("yes", "no")]
  res = cloze.zero_shot_classify(
      tiny["out"], [(a, b, None) for a, b in pairs], template,
      ["terrible", "great"])
  runner = mask_filling.FillMask(*mask_filling.load(tiny["out"]))
  expected = np.stack([_by_hand(runner, template, a, b) for a, b in pairs])
  np.testing.assert_allclose(res["scores"], expected, atol=2e-5, rtol=0)
  assert res["accuracy"] is None and res["labels"] == ["0", "1"]


@pytest.mark.slow
def test_workdir_and_hf_dir_agree(tiny, tmp_path):
  from tests.helpers.checkpoints import save_checkpoints
  workdir = str(tmp_path / "workdir")
  # A real training workdir: a step-3 checkpoint of the same params.
  save_checkpoints(workdir, tiny["config"], {3: tiny["params"]})
  examples = [(t, None, l) for t, l in zip(TEXTS[:4], LABELS)]
  a = cloze.zero_shot_classify(workdir, examples, TEMPLATE, VERBALIZER,
                                   step=3)
  b = cloze.zero_shot_classify(tiny["out"], examples, TEMPLATE,
                                   VERBALIZER)
  np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-6)
  assert a["predictions"] == b["predictions"]


def test_multi_piece_verbalizer_word_is_an_error(tiny):
  with pytest.raises(ValueError, match=r"'wonderful' is 2 tokens "
                     r"\['wonder', '##ful'\]"):
    cloze.zero_shot_classify(tiny["out"], [("a", None, "0")], TEMPLATE,
                                 ["terrible", "wonderful"])


def test_long_text_is_truncated_keeping_the_template_tail(tiny):
  loaded = embeddings.load_masked_lm(tiny["out"])
  clf = cloze.ZeroShotClassifier(loaded, TEMPLATE, VERBALIZER)
  long_text = " ".join(["the movie was very long"] * 40)  # ~200 tokens.
  encs, n = clf.encode([(long_text, None, "pos"), ("fun", None, "pos")])
  assert n == 1 and len(encs[0].ids) == 64 == clf.max_length
  assert encs[0].tokens[-5:] == ["it", "was", "[MASK]", ".", "[SEP]"]
  assert encs[0].tokens[:4] == ["[CLS]", "the", "movie", "was"]
  res = clf([(long_text, None, "pos"), ("fun", None, "neg")])
  assert res["num_truncated"] == 1 and res["scores"].shape == (2, 2)
  # Same scores as fill_mask on the text cut to what survived.
  kept = clf._tok.decode(encs[0].ids, skip_special_tokens=True)
  kept = kept[:kept.rindex(" it was")]
  runner = mask_filling.FillMask(*mask_filling.load(tiny["out"]))
  np.testing.assert_allclose(res["scores"][0],
                             _by_hand(runner, TEMPLATE, kept), atol=2e-5)
  # Pairs: the longer text is cut first; the short one survives whole.
  pair = cloze.ZeroShotClassifier(loaded, "{text} ? [MASK] , {text_b}",
                                      VERBALIZER, max_length=40)
  encs, _ = pair.encode([(long_text, "we saw it", None)])
  assert len(encs[0].ids) == 40
  assert encs[0].tokens[-7:] == ["?", "[MASK]", ",", "we", "saw", "it",
                                 "[SEP]"]


def test_template_without_room_is_an_error(tiny):
  loaded = embeddings.load_masked_lm(tiny["out"])
  clf = cloze.ZeroShotClassifier(
      loaded, "{text} " + "very " * 20 + "[MASK].", VERBALIZER, max_length=16)
  with pytest.raises(ValueError, match="alone is longer than max_length=16"):
    clf([("fun", None, None)])


def test_model_without_mlm_head_is_an_error(tiny, tmp_path):
  d = str(tmp_path / "bertmodel")
  tiny_models.strip_mlm_head(tiny["out"], d)
  with pytest.raises(ValueError, match="no masked-LM head"):
    cloze.zero_shot_classify(d, [("a", None, None)], TEMPLATE,
                                 VERBALIZER)


def test_unknown_label_and_text_with_mask_are_errors(tiny):
  with pytest.raises(ValueError, match="label 'maybe'"):
    cloze.zero_shot_classify(tiny["out"], [("a", None, "maybe")],
                                 TEMPLATE, VERBALIZER)
  with pytest.raises(ValueError, match=r"Example 0 has 2 \[MASK\]"):
    cloze.zero_shot_classify(tiny["out"], [("a [MASK]", None, None)],
                                 TEMPLATE, VERBALIZER)


def test_rows_hook_counts_bad_rows():
  rows = [{"sentence": b"fun", "label": 1}, {"label": 0},
          {"sentence": "bad", "label": np.int64(0)}, {"sentence": "x"},
          {"sentence": " ", "label": "1"}]
  examples, bad = cloze.examples_from_rows(rows, "sentence")
  assert examples == [("fun", None, 1), ("bad", None, 0), ("x", None, None)]
  assert bad == [(2, "no 'sentence' text"), (5, "no 'sentence' text")]


def _write(path, text):
  with open(path, "w") as f:
    f.write(text)
  return str(path)


def test_cli_prints_accuracy_of_a_tsv_and_jsonl(tiny, tmp_path, capsys):
  rows = list(zip(TEXTS, [{"neg": 0, "pos": 1}[l] for l in LABELS]))
  tsv = _write(tmp_path / "dev.tsv", "sentence\tlabel\n" + "".join(
      f"{t}\t{l}\n" for t, l in rows))
  jsonl = _write(tmp_path / "dev.jsonl", "".join(
      json.dumps({"sentence": t, "label": l}) + "\n" for t, l in rows)
                 + "not json\n")
  expected = cloze.zero_shot_classify(
      tiny["out"], [(t, None, l) for t, l in rows], TEMPLATE,
      ["terrible", "great"])["accuracy"]
  for path in (tsv, jsonl):
    preds = str(tmp_path / "preds.jsonl")
    rc = zero_shot.main(["--model", tiny["out"], "--input", path,
                         "--template", TEMPLATE, "--verbalizer",
                         "terrible,great", "--text_field", "sentence",
                         "--predictions", preds])
    out = capsys.readouterr().out
    assert rc == 0
    assert f"Zero-shot accuracy: {expected:.4f} ({len(rows)} labeled" in out
    with open(preds) as f:
      assert len(f.readlines()) == len(rows)
  assert ("Skipped 1 bad row(s) (data rows, from 1): 13 (no 'sentence' "
          "text)") in out


@pytest.mark.parametrize("case", ["missing", "no_mask", "empty", "piece"])
def test_cli_bad_input_is_one_error_line(tiny, tmp_path, case):
  path = _write(tmp_path / "in.tsv", "" if case == "empty" else
                "text\tlabel\nfun\t1\n")
  args = {"missing": dict(input=str(tmp_path / "nope.tsv")),
          "no_mask": dict(template="{text} It was good."),
          "empty": {}, "piece": dict(verbalizer="terrible,wonderful")}[case]
  argv = ["--model", tiny["out"], "--input", args.get("input", path),
          "--template", args.get("template", TEMPLATE),
          "--verbalizer", args.get("verbalizer", "terrible,great")]
  res = in_process.run_module("zero_shot", *argv)
  assert res.returncode == 1, res.stderr
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
  assert {"missing": "nope.tsv does not exist", "no_mask": "[MASK]",
          "empty": "no usable rows", "piece": "wonderful"}[case] in lines[0]
