"""Downstream on ModernBERT: fine-tuning from a ModernBERT Hugging Face
directory learns the keyword task and exports a
ModernBertForSequenceClassification with our logits; sentence embeddings
equal transformers' hidden states, layer by layer."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import pretrained
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files
from bert_jax.models import modernbert
from tests.helpers import family_checks
from tests.helpers import tiny_models

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A random tiny ModernBertForMaskedLM with a WordPiece tokenizer."""
  base = str(tmp_path_factory.mktemp("modernbert_down"))
  vocab_path = os.path.join(base, "vocab.txt")
  vocab = tiny_models.write_vocab(vocab_path)
  config = family_checks.family_config("modernbert").model
  config.update(vocab_size=len(vocab), max_position_embeddings=64)
  model = modernbert.ModernBertForMaskedLM(config, rngs=nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  out = os.path.join(base, "hf")
  checkpoint_io.save_hf_model(
      out, params, config, family="modernbert",
      tokenizer=tokenizer_files.TokenizerSpec("wordpiece", vocab_path, True))
  return dict(base=base, out=out, config=config)


def test_finetune_learns_and_exports_a_sequence_classifier(hf_dir, tmp_path):
  from bert_jax import export
  from bert_jax.downstream import finetuning
  train, dev = tiny_models.write_keyword_task(str(tmp_path / "task"),
                                              n_train=256, n_dev=64)
  config = tiny_models.finetune_config(hf_dir["out"], train, dev,
                                       num_steps=40)
  config.task.buckets = (16, 32)
  config.model.update(hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
  workdir = str(tmp_path / "ft")
  results = finetuning.run(config, workdir)
  assert results["scores"]["validation"]["accuracy"] > 0.8, results
  # The run is a ModernBERT classifier, and exports as one.
  source = pretrained.resolve(workdir)
  assert source.config.objective.name == "modernbert_classify"
  assert export.architecture("modernbert_classify") == (
      "ModernBertForSequenceClassification")
  out = str(tmp_path / "ft_hf")
  export.export_run(workdir, out)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["architectures"] == ["ModernBertForSequenceClassification"]
  assert cfg["id2label"] == {"0": "neg", "1": "pos"}
  config = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, config)
  tok = pretrained.load_tokenizer(source).tokenizer
  enc = [tok.encode(t) for t in ("the movie was great", "we saw a bad film")]
  ids = np.zeros((2, 12), np.int32)
  for i, e in enumerate(enc):
    ids[i, :len(e.ids)] = e.ids
  mask = (ids > 0).astype(np.int32)
  graphdef, state = nnx.split(mapping.make_model(
      params, config, family="modernbert_classify"))
  ours = np.asarray(jax.jit(lambda s: nnx.merge(graphdef, s)(ids, mask))(
      state))
  model = transformers.ModernBertForSequenceClassification.from_pretrained(
      out, attn_implementation="eager", dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long(),
                   attention_mask=torch.tensor(mask).long()).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
  assert np.argmax(ours, -1).tolist() == [1, 0]  # pos, neg.


@pytest.mark.parametrize("layer", [1, -1])
def test_embeddings_equal_transformers_hidden_states(hf_dir, layer):
  """embed() (mean over real tokens) on the directory equals the mean of
  transformers' output_hidden_states at the same index (the last one
  after the final norm, as HF's)."""
  from bert_jax.downstream import embeddings
  loaded = embeddings.load_model(hf_dir["out"])
  model = mapping.make_model(loaded.params, loaded.model_config,
                             family=loaded.family)
  sentences = ["the movie was great", "a long night on the river bank ,"
               " we walked along the water and opened our account ."]
  ours = embeddings.embed(model, loaded.tokenizer, sentences, pooling="mean",
                          layer=layer)
  tok = transformers.AutoTokenizer.from_pretrained(hf_dir["out"])
  hf = transformers.ModernBertModel.from_pretrained(
      hf_dir["out"], attn_implementation="eager", dtype=torch.float32).eval()
  for i, text in enumerate(sentences):
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
      h = hf(input_ids=enc["input_ids"], output_hidden_states=True
             ).hidden_states[layer][0].numpy()
    np.testing.assert_allclose(ours[i], h.mean(0), atol=1e-4)


@pytest.mark.parametrize("kind", ["token", "span"])
def test_token_and_span_tasks_are_refused_in_one_line(hf_dir, tmp_path,
                                                      kind):
  """ModernBERT has a sequence classifier only here: a token or span task
  from it is one error naming the checkpoint and what it can do, raised
  before anything is written."""
  from bert_jax.downstream import finetuning
  from tests import helpers
  from tests.helpers import span_tag_tasks
  write = (span_tag_tasks.write_tagging_task if kind == "token" else
           span_tag_tasks.write_qa_task)
  train, dev = write(str(tmp_path / "task"), n_train=4, n_dev=2)
  config = helpers.load_config("ner" if kind == "token" else "squad")
  config.task.update(name="gen", train_file=train, validation_file=dev)
  config.train.init_from = hf_dir["out"]
  config.data.seq_length = 64
  with pytest.raises(ValueError) as e:
    finetuning.run(config, str(tmp_path / "ft"))
  assert str(e.value) == (
      f"task.kind={kind!r}: train.init_from={hf_dir['out']} is a modernbert "
      f"checkpoint, which has no {kind} head here (only sentence tasks: "
      "modernbert_classify); token and span tasks fine-tune BERT, ALBERT, "
      "ELECTRA or DistilBERT encoders.")
  assert helpers.written_files(tmp_path / "ft") == []
