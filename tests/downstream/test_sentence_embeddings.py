"""Packed sentence vectors, streamed files, and the scoring command.

Several sentences a row give each sentence's own vector (BERT and
ModernBERT, whose sliding window stays inside each sentence too); the
model's pooling and normalisation come with it; ``bert_jax.embed`` streams
any number of lines to one .npy or to shards; ``bert_jax.evaluate_embeddings``
scores STS pairs and BEIR retrieval with the pairs kind's metrics (the
streamed top-k equals a full sort; the run file's trec_eval numbers are
the printed ones) and refuses bad files before writing anything.
"""

import json
import os

import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import config_lib
from bert_jax.downstream import embedding_eval
from bert_jax.downstream import packed_texts
from bert_jax.downstream import sentence_embeddings
from bert_jax.tasks import pair_scoring
from tests import helpers
from tests.helpers import in_process
from tests.helpers import tiny_models

DATA = os.path.join(helpers.REPO, "tests", "data_files")
SENTENCES = ["the movie was great", "", "i loved the long story about the "
             "river bank and the money in my account", "no", "fun !",
             "we walked along the river at night"] * 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  return tiny_models.make_embedding_dir(
      str(tmp_path_factory.mktemp("emb")), pooling="mean", normalize=True)


def _alone(embedder, sentences):
  """Each sentence alone in a padded row of its own length."""
  out = []
  for s in sentences:
    ids = np.asarray([embedder.tokenizer.encode(s).ids], np.int32)
    out.append(np.asarray(embedder.model(ids, np.ones_like(ids),
                                         np.zeros_like(ids)))[0])
  return np.stack(out)


def test_packed_rows_give_each_sentence_its_own_vector(model_dir):
  embedder = sentence_embeddings.load(model_dir, row_length=64,
                                      max_sequences=8, rows_per_step=2)
  assert (embedder.pooling, embedder.normalize) == ("mean", True)
  np.testing.assert_allclose(embedder.encode(SENTENCES),
                             _alone(embedder, SENTENCES), atol=1e-5)
  ids = [embedder.tokenizer.encode(s).ids for s in SENTENCES]
  rows = [r for b in packed_texts.batches(
      ids, [[0] * len(x) for x in ids], seq_length=64, max_sequences=8,
      batch_size=2, max_positions=64)
          for r in b[packed_texts.INDEX] if (r >= 0).any()]
  assert len(rows) < len(SENTENCES) / 3  # Several a row.
  assert sorted(i for r in rows for i in r if i >= 0) == list(
      range(len(SENTENCES)))  # Each sentence once.


def test_a_modernbert_packed_row_keeps_its_window_inside_each_sentence():
  config = config_lib.get_config("tiny")
  config.model.update(vocab_size=64, hidden_size=32, num_hidden_layers=3,
                      num_attention_heads=2, intermediate_size=48,
                      max_position_embeddings=64, type_vocab_size=0,
                      local_attention=8, global_attn_every_n_layers=3,
                      layer_norm_eps=1e-5, embedding_pooling="cls")
  model = compose.embedding_table("modernbert").make_model(config.model,
                                                           nnx.Rngs(0))
  r = np.random.RandomState(0)
  sentences = [r.randint(5, 64, n).astype(np.int32) for n in (20, 9, 13, 3)]
  (batch,) = packed_texts.batches(
      sentences, [[0] * len(x) for x in sentences], seq_length=64,
      max_sequences=4, batch_size=1, max_positions=64)
  ids, seq, pos, cls = (batch[k] for k in ("input_ids", "sequence_ids",
                                           "position_ids", "cls_positions"))
  packed = np.asarray(model(ids, (seq > 0).astype(np.int32),
                            np.zeros_like(ids), sequence_ids=seq,
                            position_ids=pos, cls_positions=cls))[0]
  slot = {int(i): k for k, i in enumerate(batch[packed_texts.INDEX][0])}
  for i, s in enumerate(sentences):
    alone = np.asarray(model(s[None], np.ones((1, len(s)), np.int32),
                             np.zeros((1, len(s)), np.int32)))[0]
    np.testing.assert_allclose(packed[slot[i]], alone, atol=2e-5)


def test_embed_streams_lines_to_a_file_or_to_shards(model_dir, tmp_path,
                                                    monkeypatch):
  monkeypatch.setattr(sentence_embeddings, "CHUNK", 4)  # Several chunks.
  inp = tmp_path / "lines.txt"
  inp.write_text("".join(s + "\n" for s in SENTENCES))
  embedder = sentence_embeddings.load(model_dir)
  want = _alone(embedder, SENTENCES)
  n, files = sentence_embeddings.write(embedder, str(inp),
                                       str(tmp_path / "v.npy"))
  assert n == len(SENTENCES) and files == [str(tmp_path / "v.npy")]
  np.testing.assert_allclose(np.load(files[0]), want, atol=1e-5)
  n, files = sentence_embeddings.write(embedder, str(inp),
                                       str(tmp_path / "s.npy"), shard_rows=7)
  assert [os.path.basename(f) for f in files] == [
      "s-00000.npy", "s-00001.npy", "s-00002.npy"]
  shards = [np.load(f, mmap_mode="r") for f in files]
  assert [len(s) for s in shards] == [7, 7, 4]
  np.testing.assert_allclose(np.concatenate(shards), want, atol=1e-5)
  assert sorted(os.listdir(tmp_path)) == sorted(
      ["lines.txt", "v.npy", "s-00000.npy", "s-00001.npy", "s-00002.npy"])


def test_the_embed_command_uses_the_models_own_pooling(model_dir, tmp_path):
  inp = tmp_path / "lines.txt"
  inp.write_text("".join(s + "\n" for s in SENTENCES[:6]))
  out = str(tmp_path / "v.npy")
  res = in_process.run_module("embed", "--model", model_dir, "--input",
                              str(inp), "--output", out)
  assert res.returncode == 0, res.stderr[-3000:]
  assert "(mean pooling, normalised, 64 tokens at most)" in res.stdout
  vectors = np.load(out)
  np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
  np.testing.assert_allclose(
      vectors, sentence_embeddings.load(model_dir).encode(SENTENCES[:6]),
      atol=1e-5)


def test_streamed_top_k_equals_a_full_sort():
  r = np.random.RandomState(0)
  queries, docs = r.randn(7, 16), r.randn(50, 16)
  docs[10] = docs[3]  # A tie.
  top = embedding_eval.TopK(queries, 12)
  for lo in range(0, 50, 9):
    top.add(docs[lo:lo + 9])
  index, scores = top.result()
  want_i, want_s = pair_scoring.search(queries, docs, 12)
  np.testing.assert_allclose(scores, want_s, atol=1e-6)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  full = unit(queries) @ unit(docs).T
  np.testing.assert_allclose(np.take_along_axis(full, index, 1), scores,
                             atol=1e-6)
  assert (np.sort(full, axis=1)[:, ::-1][:, :12] - scores).max() < 1e-6
  assert (want_i == index).mean() > 0.9  # Equal but for the tied pair.


def test_the_scoring_command_on_sts_pairs_and_retrieval(model_dir,
                                                        tmp_path):
  pytrec_eval = pytest.importorskip("pytrec_eval")
  from bert_jax.data import beir
  beir_dir = tiny_models.write_beir_from_pairs(
      str(tmp_path / "beir"), os.path.join(DATA, "mrpc_dev.tsv"),
      "#1 String", "#2 String", "Quality")
  out, run = str(tmp_path / "results.json"), str(tmp_path / "run.trec")
  res = in_process.run_module(
      "evaluate_embeddings", "--model", model_dir, "--pairs",
      os.path.join(DATA, "stsb_dev.tsv"), "--beir", beir_dir, "--top_k",
      "20", "--run_file", run, "--output", out)
  assert res.returncode == 0, res.stderr[-3000:]
  with open(out) as f:
    results = json.load(f)
  assert set(results["pairs"]) == {"pearson", "spearman"}
  assert "retrieval: ndcg@10" in res.stdout
  written = {}
  with open(run) as f:
    for line in f:
      qid, _, doc, _, score, _ = line.split()
      written.setdefault(qid, {})[doc] = float(score)
  qrels = beir.read(beir_dir, "test").qrels
  theirs = pytrec_eval.RelevanceEvaluator(
      qrels, {"ndcg_cut_10", "map_cut_100"}).evaluate(written)
  for ours, trec in (("ndcg@10", "ndcg_cut_10"), ("map@100", "map_cut_100")):
    assert abs(results["retrieval"][ours] - np.mean(
        [theirs[q][trec] for q in qrels])) < 1e-9


@pytest.mark.parametrize("case", ["qrels_unknown_doc", "empty_text",
                                  "missing_column"])
def test_the_scoring_command_refuses_bad_files_writing_nothing(
    model_dir, tmp_path, case):
  beir_dir = tiny_models.write_beir_from_pairs(
      str(tmp_path / "beir"), os.path.join(DATA, "mrpc_dev.tsv"),
      "#1 String", "#2 String", "Quality")
  pairs = tmp_path / "pairs.tsv"
  pairs.write_text("sentence1\tsentence2\tscore\na dog\ta cat\t1.5\n"
                   + ("\tnothing\t2.0\n" if case == "empty_text" else ""))
  if case == "qrels_unknown_doc":
    with open(os.path.join(beir_dir, "qrels", "test.tsv"), "a") as f:
      f.write("q0\tghost\t1\n")
  out = str(tmp_path / "results.json")
  argv = ["--model", model_dir, "--pairs", str(pairs), "--beir", beir_dir,
          "--output", out, "--run_file", str(tmp_path / "run.trec")]
  if case == "missing_column":
    argv += ["--label_field", "similarity"]
  res = in_process.run_module("evaluate_embeddings", *argv)
  assert res.returncode == 1
  lines = helpers.failure_lines(res, max_lines=1)
  assert {"qrels_unknown_doc": "document 'ghost' is not in",
          "empty_text": f"{pairs}:3: empty text in 'sentence1'",
          "missing_column": "no column 'similarity'"}[case] in lines[0]
  assert not os.path.exists(out) and not os.path.exists(
      str(tmp_path / "run.trec"))
