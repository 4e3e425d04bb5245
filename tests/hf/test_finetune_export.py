"""A fine-tuned run exported to Hugging Face BertForSequenceClassification.

One short in-process fine-tuning run (tiny random BERT, keyword task, 40
steps) is exported with bert_jax.to_hf (positional WORKDIR OUT; the
class comes from the run's objective); PyTorch must compute our logits, the
text-classification pipeline must return our label names, and the directory
must import back bit for bit. A 3-step regression run exports with
problem_type "regression".
"""

import json
import os

import jax
import numpy as np
import pytest

from bert_jax import compose
from bert_jax import to_hf
from tests import helpers
from tests.helpers import tiny_models

REPO = helpers.REPO

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TEXTS = ["the movie was great", "a really boring film", "we saw it",
         "the plot was awful and the acting very nice", "fun fun fun",
         "i watched this story", "the acting was quite good but the plot bad",
         "nice"]


def _finetune_and_export(base, *, regression: bool, num_steps: int):
  from bert_jax.downstream import finetuning
  hf = tiny_models.make_hf_dir(os.path.join(base, "base"))
  train, dev = tiny_models.write_keyword_task(
      os.path.join(base, "task"), n_train=256, n_dev=32,
      regression=regression)
  config = tiny_models.finetune_config(hf["out"], train, dev,
                                       num_steps=num_steps,
                                       regression=regression)
  workdir = os.path.join(base, "run")
  results = finetuning.run(config, workdir)
  out = os.path.join(base, "hf_export")
  assert to_hf.main([workdir, out]) == 0
  return dict(workdir=workdir, out=out, results=results, base_hf=hf)


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory):
  return _finetune_and_export(str(tmp_path_factory.mktemp("ft_cls")),
                              regression=False, num_steps=40)


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
  return _finetune_and_export(str(tmp_path_factory.mktemp("ft_reg")),
                              regression=True, num_steps=3)


def _trained_params(workdir):
  from bert_jax import pretrained
  source = pretrained.resolve(workdir)
  model_config = pretrained.load_model_config(source)
  params, _ = pretrained.load_params(source, model_config)
  return params, model_config


def _our_logits(params, model_config, batch):
  """Our classify objective's logits (jitted, float32, no dropout)."""
  from flax import nnx

  from bert_jax.hf import mapping
  from bert_jax.tasks import sentence as sentence_kind
  model = mapping.make_model(params, model_config,
                             compose.task_table("bert", "sentence"))
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, b: sentence_kind.logits(nnx.merge(graphdef, s), b,
                                                 None, True))
  return np.asarray(fn(state, batch))


def _hf_batch(out, texts):
  tok = transformers.AutoTokenizer.from_pretrained(out)
  enc = tok(texts, padding="max_length", max_length=32, truncation=True,
            return_tensors="np")
  return dict(input_ids=enc["input_ids"].astype(np.int32),
              input_mask=enc["attention_mask"].astype(np.int32),
              segment_ids=enc["token_type_ids"].astype(np.int32))


def _torch_logits(out, batch):
  model = transformers.BertForSequenceClassification.from_pretrained(out)
  model.eval()
  with torch.no_grad():
    return model(input_ids=torch.from_numpy(batch["input_ids"]).long(),
                 attention_mask=torch.from_numpy(batch["input_mask"]).long(),
                 token_type_ids=torch.from_numpy(batch["segment_ids"]).long()
                 ).logits.numpy()


@pytest.mark.slow
def test_config_names_the_class_and_the_run_labels(classify_run):
  out = classify_run["out"]
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["architectures"] == ["BertForSequenceClassification"]
  assert classify_run["results"]["label_names"] == ["neg", "pos"]
  assert cfg["num_labels"] == 2
  assert cfg["id2label"] == {"0": "neg", "1": "pos"}
  assert cfg["label2id"] == {"neg": 0, "pos": 1}
  assert cfg["problem_type"] == "single_label_classification"
  for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "vocab.txt"):
    assert os.path.isfile(os.path.join(out, name)), name
  hf_cfg = transformers.AutoConfig.from_pretrained(out)
  assert hf_cfg.id2label == {0: "neg", 1: "pos"}


@pytest.mark.slow
def test_pytorch_logits_equal_ours(classify_run):
  params, model_config = _trained_params(classify_run["workdir"])
  worst = 0.0
  for i in range(0, len(TEXTS), 4):  # A few batches.
    batch = _hf_batch(classify_run["out"], TEXTS[i:i + 4])
    ours = _our_logits(params, model_config, batch)
    theirs = _torch_logits(classify_run["out"], batch)
    assert ours.shape == theirs.shape == (4, 2)
    worst = max(worst, float(np.max(np.abs(ours - theirs))))
  print(f"max |logits ours - PyTorch| = {worst:.3g}")
  assert worst < 1e-4
  # The head was trained (not the fresh init): it separates the keywords.
  batch = _hf_batch(classify_run["out"], ["great great", "awful awful"])
  ours = _our_logits(params, model_config, batch)
  assert ours[0, 1] - ours[0, 0] > ours[1, 1] - ours[1, 0]


@pytest.mark.slow
def test_pipeline_returns_our_label_names(classify_run):
  params, model_config = _trained_params(classify_run["workdir"])
  clf = transformers.pipeline("text-classification", model=classify_run["out"])
  got = clf(TEXTS)
  ours = _our_logits(params, model_config,
                     _hf_batch(classify_run["out"], TEXTS))
  names = classify_run["results"]["label_names"]
  assert [g["label"] for g in got] == [names[i] for i in ours.argmax(-1)]
  probs = np.exp(ours - ours.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  np.testing.assert_allclose([g["score"] for g in got], probs.max(-1),
                             atol=1e-5)


@pytest.mark.slow
def test_export_imports_back_exactly(classify_run):
  from bert_jax import pretrained
  from bert_jax.hf import mapping
  params, model_config = _trained_params(classify_run["workdir"])
  source = pretrained.resolve(classify_run["out"])
  assert source.table is compose.task_table("bert", "sentence")
  back_config = pretrained.load_model_config(source)
  assert back_config.num_labels == 2
  back, report = pretrained.load_params(source, back_config)
  assert report.architecture == "BertForSequenceClassification"
  assert not report.fresh and not report.skipped
  ours, theirs = mapping.flatten_params(params), mapping.flatten_params(back)
  assert sorted(ours) == sorted(theirs)
  for k in ours:
    np.testing.assert_array_equal(np.asarray(ours[k]), theirs[k], err_msg=k)


def test_architecture_follows_the_objective():
  from bert_jax import config_lib

  def architecture(name):
    config = config_lib.complete({"objective": {"name": name}})
    return compose.hf_models(config, {})[0].table.export_architecture
  assert architecture("classify") == "BertForSequenceClassification"
  assert architecture("bert") == "BertForPreTraining"
  with pytest.raises(ValueError, match="objective.name='nope'"):
    architecture("nope")


@pytest.mark.slow
def test_regression_export_loads(regression_run):
  out = regression_run["out"]
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["architectures"] == ["BertForSequenceClassification"]
  assert cfg["num_labels"] == 1 and cfg["problem_type"] == "regression"
  params, model_config = _trained_params(regression_run["workdir"])
  assert model_config.num_labels == 1
  batch = _hf_batch(out, TEXTS[:4])
  ours = _our_logits(params, model_config, batch)
  theirs = _torch_logits(out, batch)
  assert theirs.shape == (4, 1)
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  model = transformers.BertForSequenceClassification.from_pretrained(out)
  assert model.config.problem_type == "regression"
