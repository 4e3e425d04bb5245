"""Token taggers and QA heads fine-tuned from ELECTRA, ALBERT and DistilBERT
export to their family's Hugging Face class (the table of each family x
kind, ``compose.task_table``).

Fine-tuning takes its model config from the source (``resolve_config``):
the run's objective is the task kind's (``token_classify`` / ``span_qa``)
and ``objective.encoder`` names the family. A head of that config with
random params (every weight and bias non-zero) is saved as a fine-tuning
workdir and exported with the one writer; the family's
``*ForTokenClassification`` / ``*ForQuestionAnswering`` must load it with
no missing or unexpected keys and compute our logits (1e-4), and the
export must read back as the same run. BERT's own classes are checked by
tests/downstream/test_token_tasks.py and test_span_tasks.py (pipelines).
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
from bert_jax import tasks
from bert_jax.data import squad_sources
from bert_jax.data import token_sources
from bert_jax.downstream import finetuning
from bert_jax.hf import mapping
from bert_jax.hf import vocab
from tests import helpers
from tests.helpers import tiny_models
from tests.helpers.checkpoints import assert_trees_identical
from tests.helpers.checkpoints import random_tree
from tests.helpers.checkpoints import save_checkpoints

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PREFIX = {"electra": "Electra", "albert": "Albert", "distil": "DistilBert"}
SUFFIX = {"token": "ForTokenClassification", "span": "ForQuestionAnswering"}
TAGS = ("O", "B-PER", "I-PER")
TEXTS = ["the movie was great", "a really boring film", "we saw it"]


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
    c.data.update(objective="packed", nsp=False)
  elif family == "albert":
    c.objective.name = "albert"
    c.model.update(embedding_size=16, hidden_act="gelu_new")
  else:
    c.objective.update(name="distil", teacher="random", student_layers=1)
    c.data.update(objective="packed", nsp=False)
  return c


def _head_run(base: str, family: str, kind: str):
  """(workdir of a fine-tuned head of `kind` on `family`, params, config)."""
  vocab_path = os.path.join(base, "vocab.txt")
  tiny_models.write_vocab(vocab_path)
  source = pretrained.Source(pretrained.WORKDIR, "/src",
                             config=_source_config(family, vocab_path))
  ft = helpers.load_config("ner" if kind == "token" else "squad")
  ft.train.update(init_from="/src", batch_size=8)
  ft.task.update(name="gen", max_query_length=8)
  ft.data.update(seq_length=32, tokenizer_type="wordpiece",
                 tokenizer_path=vocab_path)
  task = (token_sources.TokenTask("gen", TAGS) if kind == "token" else
          squad_sources.SpanTask("gen", version_2=True))
  config = finetuning.resolve_config(ft, source, task, num_train=64)
  assert config.objective.name == tasks.get(kind).objective
  assert config.objective.encoder == {"distil": "distilbert"}.get(family,
                                                                  family)
  make = compose.objective(config).make_model
  params = random_tree(lambda r: make(config, r), seed=1)
  workdir = os.path.join(base, "run")
  save_checkpoints(workdir, config, {5: params})
  if kind == "token":
    token_sources.save_label_map(workdir, TAGS)
  return workdir, params, config


def _our_logits(params, config, kind: str, batch):
  objective = tasks.get(kind)
  model = mapping.make_model(
      params, config.model,
      compose.task_table(config.objective.encoder, kind))
  graphdef, state = nnx.split(model)
  fn = jax.jit(lambda s, b: objective.predict(nnx.merge(graphdef, s), b,
                                              config))
  return {k: np.asarray(v) for k, v in fn(state, batch).items()}


@pytest.mark.parametrize("kind", ["token", "span"])
@pytest.mark.parametrize("family", ["electra", "albert", "distil"])
def test_head_exports_to_its_family_class(tmp_path, family, kind):
  workdir, params, config = _head_run(str(tmp_path), family, kind)
  out = str(tmp_path / "hf")
  export.export_run(workdir, out)
  with open(os.path.join(out, "config.json")) as f:
    cfg = json.load(f)
  name = PREFIX[family] + SUFFIX[kind]
  assert cfg["architectures"] == [name]
  if kind == "token":
    assert cfg["id2label"] == {str(i): t for i, t in enumerate(TAGS)}
  model, info = getattr(transformers, name).from_pretrained(
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
    got = model(input_ids=torch.from_numpy(enc["input_ids"]).long(),
                attention_mask=torch.from_numpy(enc["attention_mask"]).long())
  ours = _our_logits(params, config, kind, batch)
  real = enc["attention_mask"] == 1  # Ours masks padding out of the spans.
  pairs = ([(ours["logits"], got.logits.numpy())] if kind == "token" else
           [(ours["start_logits"], got.start_logits.numpy()),
            (ours["end_logits"], got.end_logits.numpy())])
  for mine, theirs in pairs:
    print(f"{family} {kind}: max |ours - PyTorch| = "
          f"{np.max(np.abs(mine[real] - theirs[real])):.3g}")
    np.testing.assert_allclose(mine[real], theirs[real], atol=1e-4)
  # It reads back as the same run: a head of that kind on that encoder.
  source = pretrained.resolve(out)
  assert source.objective == config.objective.name
  assert source.config.objective.encoder == config.objective.encoder
  back, report = pretrained.load_params(source)
  assert not report.fresh and not report.skipped, report.summary()
  assert_trees_identical(vocab.trim(params, cfg["vocab_size"]), back)
