"""Fine-tuned ELECTRA, ALBERT and DistilBERT classifiers export to their
family's Hugging Face sequence-classification class.

Fine-tuning takes its model config from the source (``resolve_config``):
an ELECTRA encoder gets ElectraClassificationHead's dense + gelu on [CLS],
a DistilBERT student its pre_classifier + ReLU, an ALBERT its tanh pooler,
so the head computes what the family's class computes. A classifier of
that config with random params (every weight and bias non-zero) is saved
as a fine-tuning workdir and exported with the one writer; PyTorch must
compute our logits (1e-4), ``pipeline("text-classification")`` must name
our labels (task.label_names over the file's 0/1), and the export must
read back as the same run (its 100-row
table cut to the tokenizer's 89, ``hf.vocab``).
"""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from bert_jax import compose
from bert_jax import export
from bert_jax import pretrained
from bert_jax.data import task_sources
from bert_jax.downstream import finetuning
from bert_jax.hf import mapping
from bert_jax.hf import vocab
from bert_jax.tasks import sentence as sentence_kind
from tests import helpers
from tests.helpers import tiny_models
from tests.helpers.checkpoints import assert_trees_identical
from tests.helpers.checkpoints import random_tree
from tests.helpers.checkpoints import save_checkpoints

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

# The family of each source objective's encoder.
ENCODERS = {"electra": "electra", "albert": "albert", "distil": "distilbert"}
CLASSES = {"electra": "ElectraForSequenceClassification",
           "albert": "AlbertForSequenceClassification",
           "distil": "DistilBertForSequenceClassification"}
TEXTS = ["the movie was great", "a really boring film", "we saw it",
         "the plot was awful and the acting very nice"]


def _source_config(family: str, vocab_path: str):
  """A pretraining run of `family` (E != H for ELECTRA and ALBERT)."""
  c = helpers.tiny_config(model=dict(
      vocab_size=100, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=32))
  c.data.update(tokenizer_type="wordpiece", tokenizer_path=vocab_path)
  if family == "electra":
    c.objective.name = "electra"
    c.model.embedding_size = 16
  elif family == "albert":
    c.objective.name = "albert"
    c.model.update(embedding_size=16, hidden_act="gelu_new")
  else:
    c.objective.update(name="distil", teacher="random", student_layers=1)
  return c


def _classifier_run(base: str, family: str):
  """(workdir of a fine-tuned classifier of `family`, its params, config)."""
  vocab_path = os.path.join(base, "vocab.txt")
  tiny_models.write_vocab(vocab_path)
  source = pretrained.Source(pretrained.WORKDIR, "/src",
                             config=_source_config(family, vocab_path))
  spec = task_sources.TaskSpec("kw", ("text",), label_names=("neg", "pos"))
  ft = helpers.load_config("finetune")
  ft.train.update(init_from="/src", batch_size=8)
  # Numeric labels in the files, named by the run (the export's id2label).
  ft.task.label_names = ("neg", "pos")
  ft.data.update(seq_length=32, tokenizer_type="wordpiece",
                 tokenizer_path=vocab_path)
  config = finetuning.resolve_config(ft, source, spec, num_train=64)
  assert config.objective.encoder == ENCODERS[family]
  assert config.model.pooler_act == {"electra": "gelu", "albert": "tanh",
                                     "distil": "relu"}[family]
  make = compose.objective(config).make_model
  params = random_tree(lambda r: make(config, r), seed=1)
  workdir = os.path.join(base, "run")
  save_checkpoints(workdir, config, {5: params})
  with open(os.path.join(workdir, "label_map.json"), "w") as f:
    json.dump({"label2id": {"0": 0, "1": 1}}, f)  # The file's labels.
  return workdir, params, config


def _our_logits(params, config, batch):
  model = mapping.make_model(
      params, config.model,
      compose.task_table(config.objective.encoder, "sentence"))
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, b: sentence_kind.logits(nnx.merge(graphdef, s), b,
                                                 None, True))
  return np.asarray(fn(state, batch))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["electra", "albert", "distil"])
def test_classifier_exports_to_its_family_class(tmp_path, family):
  workdir, params, config = _classifier_run(str(tmp_path), family)
  out = str(tmp_path / "hf")
  export.export_run(workdir, out)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  assert cfg["architectures"] == [CLASSES[family]]
  assert cfg["id2label"] == {"0": "neg", "1": "pos"}
  model, info = getattr(transformers, CLASSES[family]).from_pretrained(
      out, output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys",
                                   "mismatched_keys")), info
  model.eval()
  tok = transformers.AutoTokenizer.from_pretrained(out)
  enc = tok(TEXTS, padding="max_length", max_length=16, return_tensors="np")
  batch = dict(input_ids=enc["input_ids"].astype(np.int32),
               input_mask=enc["attention_mask"].astype(np.int32),
               segment_ids=np.zeros_like(enc["input_ids"], np.int32))
  with torch.no_grad():
    theirs = model(input_ids=torch.from_numpy(enc["input_ids"]).long(),
                   attention_mask=torch.from_numpy(enc["attention_mask"])
                   .long()).logits.numpy()
  ours = _our_logits(params, config, batch)
  print(f"{family}: max |logits ours - PyTorch| = "
        f"{np.max(np.abs(ours - theirs)):.3g}")
  np.testing.assert_allclose(ours, theirs, atol=1e-4)
  got = transformers.pipeline("text-classification", model=out)(TEXTS)
  assert [g["label"] for g in got] == [("neg", "pos")[i]
                                       for i in ours.argmax(-1)]
  # It reads back as the same run: a classifier of that encoder family.
  source = pretrained.resolve(out)
  assert source.objective == "classify"
  assert source.config.objective.encoder == ENCODERS[family]
  assert source.config.model.pooler_act == config.model.pooler_act
  back, report = pretrained.load_params(source)
  assert not report.fresh and not report.skipped, report.summary()
  assert_trees_identical(vocab.trim(params, cfg["vocab_size"]), back)


def test_released_classifiers_resolve_to_what_reads_them(tmp_path):
  """Hugging Face's own classifiers: ELECTRA's and DistilBERT's read as
  classify runs of that encoder; an ALBERT one with shared groups (every
  released ALBERT) as an ALBERT run, whose encoder fine-tuning copies into
  its layers (the classify table holds one group per layer)."""
  small = dict(vocab_size=100, num_attention_heads=2,
               max_position_embeddings=32)
  models = {
      "electra": transformers.ElectraForSequenceClassification(
          transformers.ElectraConfig(embedding_size=16, hidden_size=32,
                                     num_hidden_layers=2,
                                     intermediate_size=64, **small)),
      "distil": transformers.DistilBertForSequenceClassification(
          transformers.DistilBertConfig(dim=32, n_layers=2, hidden_dim=64,
                                        vocab_size=100, n_heads=2,
                                        max_position_embeddings=32)),
      "albert": transformers.AlbertForSequenceClassification(
          transformers.AlbertConfig(embedding_size=16, hidden_size=32,
                                    num_hidden_layers=2, num_hidden_groups=1,
                                    intermediate_size=64, **small)),
  }
  for family, model in models.items():
    model.save_pretrained(str(tmp_path / family))
    source = pretrained.resolve(str(tmp_path / family))
    _, report = pretrained.load_params(source)
    if family == "albert":
      assert (source.table.name, source.objective) == ("albert", "albert")
      assert report.skipped == ["classifier.bias", "classifier.weight"]
    else:
      assert source.objective == "classify"
      assert source.config.objective.encoder == ENCODERS[family]
      assert not report.fresh and not report.skipped, report.summary()
