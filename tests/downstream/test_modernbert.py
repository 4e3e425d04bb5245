"""Downstream on ModernBERT: fine-tuning from a ModernBERT Hugging Face
directory learns the keyword task and exports a
ModernBertForSequenceClassification with our logits; a token (NER) and a
span (SQuAD 2.0) task fine-tune ModernBERT's own heads and export as
ModernBertForTokenClassification / ForQuestionAnswering with our logits;
sentence embeddings equal transformers' hidden states, layer by layer."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import pretrained
from bert_jax.families import modernbert as modernbert_family
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
  checkpoint_io.save_hf_model(out, params, config, table=modernbert_family.MODERNBERT,
      tokenizer=tokenizer_files.TokenizerSpec("wordpiece", vocab_path, True))
  return dict(base=base, out=out, config=config)


@pytest.mark.slow
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
  assert (source.config.objective.name, source.config.objective.encoder) == (
      "classify", "modernbert")
  assert compose.task_table("modernbert", "sentence").export_architecture == (
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
  graphdef, state = nnx.split(mapping.make_model(params, config, compose.task_table("modernbert", "sentence")))
  ours = np.asarray(jax.jit(lambda s: nnx.merge(graphdef, s)(ids, mask))(
      state))
  model = transformers.ModernBertForSequenceClassification.from_pretrained(
      out, attn_implementation="eager", dtype=torch.float32).eval()
  with torch.no_grad():
    theirs = model(input_ids=torch.tensor(ids).long(),
                   attention_mask=torch.tensor(mask).long()).logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
  assert np.argmax(ours, -1).tolist() == [1, 0]  # pos, neg.


@pytest.mark.slow
@pytest.mark.parametrize("layer,packing", [(1, False), (-1, False),
                                           (-1, True)])
def test_embeddings_equal_transformers_hidden_states(hf_dir, layer, packing):
  """embed() (mean over real tokens) on the directory equals the mean of
  transformers' output_hidden_states at the same index (the last one
  after the final norm, as HF's); on packed rows too (both sentences in
  one row, past the sliding window)."""
  from bert_jax.downstream import embeddings
  loaded = embeddings.load_model(hf_dir["out"])
  model = mapping.make_model(loaded.params, loaded.model_config,
                             loaded.table)
  sentences = ["the movie was great", "a long night on the river bank ,"
               " we walked along the water and opened our account ."]
  ours = embeddings.embed(model, loaded.tokenizer, sentences, pooling="mean",
                          layer=layer, packing=packing, seq_length=64)
  tok = transformers.AutoTokenizer.from_pretrained(hf_dir["out"])
  hf = transformers.ModernBertModel.from_pretrained(
      hf_dir["out"], attn_implementation="eager", dtype=torch.float32).eval()
  for i, text in enumerate(sentences):
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
      h = hf(input_ids=enc["input_ids"], output_hidden_states=True
             ).hidden_states[layer][0].numpy()
    np.testing.assert_allclose(ours[i], h.mean(0), atol=1e-4)


# --- token and span tasks ------------------------------------------------------
SEQ = 64  # Longer than the 8-token window (family_config's).
# kind -> (objective, transformers class, steps, learning rate).
PER_TOKEN = {"token": ("token_classify",
                       "ModernBertForTokenClassification", 60, 5e-3),
             "span": ("span_qa", "ModernBertForQuestionAnswering",
                      60, 3e-3)}


def _per_token_config(kind, init_from, train, dev):
  _, _, steps, lr = PER_TOKEN[kind]
  config = tiny_models.finetune_config(init_from, train, dev, num_steps=steps,
                                       learning_rate=lr)
  config.task.update(name=f"generated_{kind}", kind=kind, buckets=(SEQ,))
  if kind == "span":
    config.task.update(doc_stride=24, max_query_length=16,
                       max_answer_length=30)
  config.data.seq_length = SEQ
  config.train.update(log_every=1, warmup_steps=6, warmup_fraction=0.0)
  config.model.update(hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)
  return config


@pytest.fixture(scope="module", params=["token", "span"])
def per_token_run(hf_dir, tmp_path_factory, request):
  """A token (CoNLL) or span (SQuAD 2.0) task fine-tuned from the
  ModernBertForMaskedLM directory, exported."""
  from bert_jax import export
  from bert_jax.downstream import finetuning
  from tests.helpers import span_tag_tasks
  kind = request.param
  base = tmp_path_factory.mktemp(f"modernbert_{kind}")
  write = (span_tag_tasks.write_tagging_task if kind == "token" else
           span_tag_tasks.write_qa_task)
  train, dev = write(str(base / "task"), n_train=160, n_dev=32)
  workdir = str(base / "ft")
  results = finetuning.run(_per_token_config(kind, hf_dir["out"], train, dev),
                           workdir)
  out = str(base / "ft_hf")
  export.export_run(workdir, out)
  return dict(kind=kind, results=results, workdir=workdir, out=out)


@pytest.mark.slow
def test_token_and_span_tasks_fine_tune_with_modernberts_heads(
    per_token_run):
  """The run is the kind's ModernBERT head (not BERT's on a BertModel),
  its loss falls and it learns the generated task (entity F1 / SQuAD F1;
  1.0 when written)."""
  from tests import helpers
  kind, results = per_token_run["kind"], per_token_run["results"]
  source = pretrained.resolve(per_token_run["workdir"])
  assert (source.config.objective.name, source.config.objective.encoder) == (
      PER_TOKEN[kind][0], "modernbert")
  assert results["kind"] == kind
  assert set(results["scores"]["validation"]) >= (
      {"f1", "precision", "recall"} if kind == "token" else
      {"exact", "f1", "HasAns_exact", "NoAns_exact"})
  losses = [r["loss"] for r in helpers.train_records(
      per_token_run["workdir"])]
  assert len(losses) == PER_TOKEN[kind][2]
  assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5]), losses
  assert results["main_score"] >= 0.9, results["scores"]


@pytest.mark.slow
def test_token_and_span_exports_load_in_their_class_with_our_logits(
    per_token_run):
  """The export is ModernBertForTokenClassification (with the run's tags)
  or ModernBertForQuestionAnswering; AutoModelFor* loads it with no
  missing or unexpected keys, and its logits on padded rows longer than
  the window equal the run's predict outputs (1e-4)."""
  kind, out = per_token_run["kind"], per_token_run["out"]
  objective_name, cls_name, _, _ = PER_TOKEN[kind]
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["architectures"] == [cls_name]
  if kind == "token":
    names = per_token_run["results"]["label_names"]
    assert len(names) == 5
    assert cfg["id2label"] == {str(i): n for i, n in enumerate(names)}
  auto = (transformers.AutoModelForTokenClassification if kind == "token"
          else transformers.AutoModelForQuestionAnswering)
  model, info = auto.from_pretrained(out, attn_implementation="eager",
                                     dtype=torch.float32,
                                     output_loading_info=True)
  assert type(model).__name__ == cls_name
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys")), info
  source = pretrained.resolve(per_token_run["workdir"])
  config = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, config)
  tok = pretrained.load_tokenizer(source).tokenizer
  texts = ("river bank opened the account and we walked along the water "
           "at night , it was a wonderful day " * 4, "what is the answer ?")
  ids = np.zeros((2, SEQ), np.int32)
  for i, t in enumerate(texts):
    e = tok.encode(t).ids[:SEQ]
    ids[i, :len(e)] = e
  mask = (ids > 0).astype(np.int32)
  assert mask[0].all() and 0 < mask[1].sum() < SEQ // 4
  batch = dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids))
  objective = compose.objective(source.config)
  assert objective.name == objective_name
  graphdef, state = nnx.split(mapping.make_model(params, config, compose.task_table("modernbert", kind)))
  ours = jax.jit(lambda s, b: objective.predict(nnx.merge(graphdef, s), b,
                                                source.config))(state, batch)
  with torch.no_grad():
    got = model(input_ids=torch.tensor(ids).long(),
                attention_mask=torch.tensor(mask).long())
  names = ("logits",) if kind == "token" else ("start_logits", "end_logits")
  real = mask.astype(bool)  # span_qa masks padding out of the spans.
  for name in names:
    mine, theirs = np.asarray(ours[name]), got[name].numpy()
    assert mine.shape == theirs.shape, name
    print(f"{kind} {name}: max |ours - PyTorch| = "
          f"{np.abs(mine[real] - theirs[real]).max():.2g} at max |logit| "
          f"{np.abs(theirs).max():.2g}")
    np.testing.assert_allclose(mine[real], theirs[real], atol=1e-4,
                               rtol=1e-4, err_msg=name)



def test_every_kind_takes_modernberts_layout_from_any_modernbert_source(
    hf_dir):
  """Each kind's head on a ModernBERT source (a pretraining directory or a
  fine-tuned head of any kind) is the kind's objective on ModernBERT's
  encoder, laid out as HF's ModernBert task classes (the prediction head
  before the output); it takes the source's encoder and prediction head
  (what HF's from_pretrained of the class keeps from a
  ModernBertForMaskedLM), its output stays fresh. A BERT source gives
  BERT's layout."""
  from bert_jax import compose
  from bert_jax import config_lib
  from bert_jax import tasks
  from bert_jax.downstream import finetuning
  want = {"sentence": "classify", "token": "token_classify",
          "span": "span_qa"}
  sources = [pretrained.resolve(hf_dir["out"])] + [
      pretrained.Source(pretrained.WORKDIR, f"/{name}",
                        config=config_lib.complete(
                            {"objective": {"name": name,
                                           "encoder": "modernbert"}}))
      for name in want.values()]
  for source in sources:
    assert finetuning.source_family(source) == "modernbert", source.objective
  for kind, objective in want.items():
    config = config_lib.complete({"objective": {"name": objective,
                                                "encoder": "modernbert"}})
    config.model.update(hidden_size=32, num_attention_heads=2,
                        num_hidden_layers=2, intermediate_size=64,
                        vocab_size=64)
    model = compose.objective(config).make_model(config, nnx.Rngs(0))
    tree = nnx.state(model, nnx.Param).to_pure_dict()
    output = tasks.get(kind).output_name
    assert set(tree) == {"model", "head", output}, kind
    table = compose.task_table("modernbert", kind)
    assert table.export_architecture == (
        "ModernBert" + tasks.get(kind).hf_suffix)
    assert {r.hf.split(".")[0] for r in table.rows} == {
        "model", "head", "classifier"}
  run = config_lib.complete({"objective": {"name": "modernbert"}})
  params = {"model": object(), "head": object(), "decoder": object()}
  got = compose.encoder_params(run, params)
  assert set(got) == {"model", "head"}
  assert got["model"] is params["model"] and got["head"] is params["head"]
  bert = pretrained.Source(pretrained.WORKDIR, "/bert",
                           config=config_lib.complete({}))
  assert finetuning.source_family(bert) == "bert"
