"""Continued pretraining of a Hugging Face directory with its own BPE
tokenizer (a RoBERTa-like and a ModernBERT-like one, transformers' random
init, built here): ``python -m bert_jax.main --config <the family's
config> --config.train.init_from=DIR`` with no model field given takes the
architecture and vocabulary from DIR's config.json and the tokenizer from
its tokenizer.json, held-out MLM accuracy rises from the start, and the
export loads in transformers, whose fill-mask pipeline gives bert_jax's
fill_mask answer. Refused in one line with nothing written: a model field
given on the command line that contradicts DIR, DIR of another family, a
tokenizer without a mask token, a tokenizer larger than DIR's embedding
table."""

import json
import os

import numpy as np
import pytest

from bert_jax.data import demo_corpus
from tests import helpers
from tests.helpers import REPO
from tests.helpers import in_process
from tests.helpers import tokenizer_dirs

transformers = pytest.importorskip("transformers")

FAMILIES = {"roberta": ("roberta_base.py", tokenizer_dirs.roberta_dir,
                        "The <mask> of the function."),
            "modernbert": ("modernbert_base.py",
                           tokenizer_dirs.modernbert_dir,
                           "The [MASK] of the function.")}
# Data, steps and schedule only: no model field.
FLAGS = ("--config.data.seq_length=64",
         "--config.data.max_predictions_per_seq=12",
         "--config.data.num_eval_batches=4", "--config.train.batch_size=16",
         "--config.train.num_steps=60", "--config.train.warmup_steps=5",
         "--config.train.learning_rate=3e-3", "--config.train.decay_steps=0",
         "--config.train.eval_every=1", "--config.train.log_every=10",
         "--config.train.peak_tflops=1.0",
         "--config.checkpoint.save_every_steps=1000")


def _domain(tmp_path):
  """A corpus of one domain (pseudo-words), train and held-out files."""
  train = demo_corpus.write_documents(
      str(tmp_path / "domain_train.txt"),
      demo_corpus.synthetic_documents(600, seed=1))
  held_out = demo_corpus.write_documents(
      str(tmp_path / "domain_eval.txt"),
      demo_corpus.synthetic_documents(60, seed=2))
  return train, held_out


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_continued_pretraining_from_a_hugging_face_directory(tmp_path,
                                                             family):
  from bert_jax.downstream import mask_filling
  config_file, make, text = FAMILIES[family]
  source = make(str(tmp_path / "source"))
  train, held_out = _domain(tmp_path)
  workdir = str(tmp_path / "run")
  proc = in_process.run_module(
      "main", "--config", os.path.join(REPO, "configs", config_file),
      "--workdir", workdir, f"--config.train.init_from={source}",
      f"--config.data.sources={train}",
      f"--config.data.eval_sources={held_out}", *FLAGS)
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = next((ln for ln in proc.stderr.splitlines()
               if f"Model from train.init_from={source}: " in ln), "")
  assert "hidden_size=64" in line and "vocab_size=800" in line, (
      proc.stderr[-3000:])
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals = [r for r in map(json.loads, f) if r["split"] == "eval"]
  # Step 1 ran at learning rate 0 (warmup): the source's own params.
  first, last = evals[0], evals[-1]
  assert first["step"] == 1 and last["step"] == 60
  print(f"{family}: held-out MLM accuracy {first['mlm_accuracy']:.4f} -> "
        f"{last['mlm_accuracy']:.4f}, loss {first['loss']:.3f} -> "
        f"{last['loss']:.3f}")
  assert last["mlm_accuracy"] > first["mlm_accuracy"] + 0.02
  assert last["loss"] < first["loss"] - 0.5

  out = str(tmp_path / "hf")
  export = in_process.run_module("to_hf", "--workdir", workdir, "--output", out)
  assert export.returncode == 0, export.stderr[-3000:]
  with open(os.path.join(source, "config.json")) as f:
    theirs = json.load(f)
  with open(os.path.join(out, "config.json")) as f:
    ours = json.load(f)
  for key in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers",
              "max_position_embeddings", "pad_token_id"):
    assert ours[key] == theirs[key], key
  got = mask_filling.fill_mask(out, text, top_k=3)
  want = transformers.pipeline("fill-mask", model=out)(text, top_k=3)
  assert [r["token"] for r in got] == [r["token"] for r in want]
  np.testing.assert_allclose([r["score"] for r in got],
                             [r["score"] for r in want], rtol=1e-4)


@pytest.fixture(scope="module")
def roberta_source(tmp_path_factory):
  return tokenizer_dirs.roberta_dir(str(tmp_path_factory.mktemp("rb")))


def _refused(config_file, source, tmp_path, overrides=(), **groups):
  """train_and_evaluate's refusal (message) of a run from `source`; the
  workdir must not exist after it."""
  from bert_jax.training import trainer as trainer_lib
  config = helpers.config_module(config_file[:-3]).get_config()
  config.train.init_from = source
  for group, fields in groups.items():
    config[group].update(fields)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    trainer_lib.train_and_evaluate(config, str(workdir),
                                   overrides=set(overrides))
  assert len(str(e.value).splitlines()) == 1
  assert not workdir.exists()
  return str(e.value)


def test_a_model_field_given_that_contradicts_the_source_is_refused(
    roberta_source, tmp_path):
  message = _refused("roberta_base.py", roberta_source, tmp_path,
                     overrides={"model.hidden_size"},
                     model=dict(hidden_size=128))
  assert message == (
      f"train.init_from: {roberta_source} has model.hidden_size=64, but "
      "--config.model.hidden_size=128 was given: the source's config "
      "decides the architecture; drop the override.")


def test_a_source_of_another_family_is_refused(roberta_source, tmp_path):
  message = _refused("modernbert_base.py", roberta_source, tmp_path)
  assert message == (
      f"train.init_from: {roberta_source} holds a RoBERTa model ('roberta'), "
      "but the config trains objective.name='modernbert' (ModernBERT); use "
      "a RoBERTa config.")


def test_a_tokenizer_without_a_mask_token_is_refused(roberta_source,
                                                      tmp_path):
  import shutil
  d = str(tmp_path / "no_mask")
  shutil.copytree(roberta_source, d)
  path = os.path.join(d, "tokenizer.json")
  with open(path, encoding="utf-8") as f:
    spec = json.load(f)
  spec["added_tokens"] = [t for t in spec["added_tokens"]
                          if t["content"] != "<mask>"]
  with open(path, "w", encoding="utf-8") as f:
    json.dump(spec, f)
  with open(os.path.join(d, "tokenizer_config.json")) as f:
    cfg = json.load(f)
  cfg.pop("mask_token")
  with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
    json.dump(cfg, f)
  message = _refused("roberta_base.py", d, tmp_path,
                     data=dict(seq_length=64, max_predictions_per_seq=10))
  assert message == (
      f"train.init_from: {d}'s tokenizer {path} lacks the special token(s) "
      "[MASK] / <mask>: masked-LM training needs them.")


def test_a_tokenizer_larger_than_the_embedding_table_is_refused(tmp_path):
  d = tokenizer_dirs.roberta_dir(str(tmp_path / "short"), vocab_size=700)
  message = _refused("roberta_base.py", d, tmp_path,
                     data=dict(seq_length=64, max_predictions_per_seq=10))
  assert message == (
      f"train.init_from: {d}'s tokenizer {d}/tokenizer.json has 800 tokens, "
      "but its embedding table has 700 rows (model.vocab_size): ids 700 and "
      "up would have no embedding; the tokenizer is not the one these params "
      "were trained with.")
