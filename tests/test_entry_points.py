"""The model-using entry points in process on one tiny random BERT: what
`python -m bert_jax.fill_mask`, `.zero_shot` and `.embed` print and write,
and their one-line refusals. (Their subprocess runs, Hugging Face pipeline
parity and memory checks are in the slow tier; `bert_jax.main` has its own
smoke test in test_main.py.)"""

import json

import jax
import numpy as np
import pytest

from bert_jax import embed
from bert_jax import fill_mask
from bert_jax import zero_shot
from tests.helpers import tiny_models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  """A random 2x64 BERT with its MLM head, as a Hugging Face directory;
  its steps compiled with few optimizations (a few short inputs)."""
  disabled = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  yield tiny_models.make_hf_dir(str(tmp_path_factory.mktemp("tiny")))
  jax.config.update("jax_disable_most_optimizations", disabled)


def test_fill_mask_prints_the_top_k_as_the_pipeline_shapes_them(tiny,
                                                                 capsys):
  text = "i loved this [MASK] ."
  assert fill_mask.main(["--model", tiny["out"], "--json", "--top_k", "3",
                         text]) == 0
  top = json.loads(capsys.readouterr().out)
  assert len(top) == 3
  scores = [r["score"] for r in top]
  assert scores == sorted(scores, reverse=True) and 0 < sum(scores) <= 1
  for r in top:
    assert r["sequence"] == f"i loved this {r['token_str']}."
  assert fill_mask.main(["--model", tiny["out"], "--top_k", "2", text]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == text
  assert [ln.split()[:2] for ln in lines[1:]] == [
      [f"{r['score']:.4f}", r["token_str"]] for r in top[:2]]


def test_fill_mask_without_a_mask_is_one_line_and_exit_1(tiny, capsys):
  assert fill_mask.main(["--model", tiny["out"], "no mask here"]) == 1
  out = capsys.readouterr()
  assert out.out == ""
  assert out.err == ('error: The text has no [MASK] token: put [MASK] where '
                     'the word to predict goes, e.g. "Paris is the [MASK] of '
                     'France."\n')


def test_zero_shot_accuracy_is_that_of_the_predictions_it_writes(
    tiny, tmp_path, capsys):
  rows = [("i loved this movie", "pos"), ("it was awful", "neg"),
          ("a good film", "pos"), ("boring and bad", "neg"),
          ("we saw the river", "")]
  data = tmp_path / "dev.tsv"
  data.write_text("text\tlabel\n" + "".join(f"{t}\t{l}\n" for t, l in rows))
  preds = tmp_path / "preds.jsonl"
  assert zero_shot.main(["--model", tiny["out"], "--input", str(data),
                         "--template", "{text} it was [MASK] .",
                         "--verbalizer", "neg:bad,pos:good",
                         "--predictions", str(preds)]) == 0
  printed = capsys.readouterr().out
  written = [json.loads(line) for line in preds.read_text().splitlines()]
  assert [r["text"] for r in written] == [t for t, _ in rows]
  for r in written:
    assert r["prediction"] == max(r["scores"], key=r["scores"].get)
  labeled = [r for r in written if r["label"]]
  accuracy = np.mean([r["prediction"] == r["label"] for r in labeled])
  assert f"Zero-shot accuracy: {accuracy:.4f} (4 labeled examples)" in printed


def test_zero_shot_labels_not_matching_the_words_is_one_line(tiny, tmp_path,
                                                             capsys):
  data = tmp_path / "dev.tsv"
  data.write_text("text\tlabel\nfun\t1\n")
  assert zero_shot.main(["--model", tiny["out"], "--input", str(data),
                         "--template", "{text} [MASK] .", "--verbalizer",
                         "bad,good", "--labels", "0,1,2"]) == 1
  assert capsys.readouterr().err == (
      "error: --labels '0,1,2' has 3 labels but --verbalizer has 2 words.\n")


def test_embed_layer_0_mean_is_the_embedding_layer_by_hand(tiny, tmp_path,
                                                           capsys):
  """Hidden state 0 is the embeddings' output: LayerNorm(word + position +
  segment 0); mean pooling averages it over the real tokens."""
  sentences = tmp_path / "s.txt"
  sentences.write_text("i loved this movie\n\nthe river bank\n")
  out, per_token = tmp_path / "v.npy", tmp_path / "t.npz"
  assert embed.main(["--model", tiny["out"], "--input", str(sentences),
                     "--output", str(out), "--per_token", str(per_token),
                     "--pooling", "mean", "--layer", "0"]) == 0
  assert capsys.readouterr().out.splitlines() == [
      f"Wrote {out}: 3 x 64 float32 (mean pooling, hidden state 0 of 0..2).",
      f"Wrote {per_token}: 13 token vectors."]
  tokens = np.load(per_token)
  assert tokens["offsets"].tolist() == [0, 6, 8, 13]
  assert tokens["tokens"][8:13].tolist() == ["[CLS]", "the", "river", "bank",
                                             "[SEP]"]
  emb = tiny["params"]["bert"]["embeddings"]
  vectors = np.load(out)
  for row, (lo, hi) in enumerate(zip(tokens["offsets"][:-1],
                                     tokens["offsets"][1:])):
    ids = tokens["ids"][lo:hi]
    x = (emb["word_embeddings"][ids] + emb["position_embeddings"][:len(ids)]
         + emb["token_type_embeddings"][0])
    x = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True)
                                                  + 1e-12)
    x = x * emb["layer_norm"]["scale"] + emb["layer_norm"]["bias"]
    np.testing.assert_allclose(tokens["vectors"][lo:hi], x, atol=1e-5)
    np.testing.assert_allclose(vectors[row], x.mean(0), atol=1e-5)


def test_embed_a_layer_the_model_lacks_is_one_line_and_writes_nothing(
    tiny, tmp_path, capsys):
  sentences = tmp_path / "s.txt"
  sentences.write_text("fun\n")
  out = tmp_path / "v.npy"
  assert embed.main(["--model", tiny["out"], "--input", str(sentences),
                     "--output", str(out), "--layer", "7"]) == 1
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("error: --layer 7"), err
  assert not out.exists()
