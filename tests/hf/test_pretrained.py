"""bert_jax.pretrained: one answer to "what is at this path" for every loader."""

import json
import os
import shutil
import time
import types

import ml_collections
import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import pretrained
from bert_jax.hf import checkpoint_io
from bert_jax.hf import importing
from bert_jax.hf import mapping
from tests.helpers.checkpoints import assert_trees_identical
from tests.helpers.checkpoints import hf_model_config as tiny_model_config
from tests.helpers.checkpoints import minilm_dir
from tests.helpers.checkpoints import random_params
from tests.helpers.checkpoints import save_checkpoints


def _config():
  config = config_lib.get_config("tiny")
  config.model = tiny_model_config()
  config.data.update(tokenizer_type="sentencepiece", tokenizer_vocab_size=600)
  return config




def _save_workdir(workdir, config, steps=(1, 2)):
  """A workdir with checkpoints of random tiny-BERT params at `steps`."""
  saved = {s: random_params(config.model, seed=s) for s in steps}
  save_checkpoints(workdir, config, saved)
  return saved


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  config = _config()
  path = tmp_path_factory.mktemp("run") / "w"
  return path, config, _save_workdir(path, config)


def test_workdir_latest_and_given_step(workdir):
  path, config, saved = workdir
  src = pretrained.resolve(str(path))
  assert (src.kind, src.step) == (pretrained.WORKDIR, 2)
  assert src.step_dir == os.path.join(str(path), "checkpoints", "2")
  assert pretrained.load_model_config(src).to_dict() == config.model.to_dict()
  params, report = pretrained.load_params(src)
  assert_trees_identical(params, saved[2])
  assert report.loaded == sorted(mapping.flatten_params(saved[2]))
  one = pretrained.resolve(str(path), step=1)
  assert one.step == 1
  assert_trees_identical(pretrained.load_params(one)[0], saved[1])
  with pytest.raises(FileNotFoundError, match="step 7"):
    pretrained.resolve(str(path), step=7)


def test_step_dir(workdir):
  path, _, saved = workdir
  src = pretrained.resolve(str(path / "checkpoints" / "1"))
  assert (src.kind, src.step, src.workdir) == (pretrained.STEP, 1, str(path))
  assert_trees_identical(pretrained.load_params(src)[0], saved[1])


def test_encoder_of_a_checkpoint_for_a_model_with_other_heads(workdir):
  """Fine-tuning takes the encoder subtree; the heads are the caller's."""
  path, config, saved = workdir
  params, _ = pretrained.load_params(str(path), config.model)
  encoder = params["bert"]
  assert set(encoder) == {"embeddings", "layers", "pooler"}
  assert_trees_identical(encoder, saved[2]["bert"])
  with pytest.raises(ValueError, match="model.hidden_size"):
    pretrained.load_params(str(path), tiny_model_config(
        hidden_size=128, num_attention_heads=2))


def test_imported_dir(tmp_path):
  cfg = tiny_model_config()
  params = random_params(cfg, seed=4)
  out = str(tmp_path / "imp")
  checkpoint_io.save_imported(out, params, cfg, importing.ImportReport(),
                              data_overrides=dict(lower_case=False))
  with open(os.path.join(out, "vocab.txt"), "w") as f:
    f.write("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
  src = pretrained.resolve(out)
  assert src.kind == pretrained.IMPORTED
  assert pretrained.load_model_config(src).hidden_size == 64
  assert_trees_identical(pretrained.load_params(src)[0], params)
  spec = pretrained.tokenizer_spec(src)
  assert (spec.kind, spec.path, spec.lower_case) == (
      "wordpiece", os.path.join(out, "vocab.txt"), False)


def test_hugging_face_dir_from_minilm():
  path = minilm_dir()
  src = pretrained.resolve(path)
  assert src.kind == pretrained.HF
  cfg = pretrained.load_model_config(src)
  assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (
      6, 384, 30522)
  spec = pretrained.tokenizer_spec(src)
  assert spec.kind == "wordpiece" and spec.path.endswith("vocab.txt")
  with pytest.raises(ValueError, match="step"):
    pretrained.resolve(path, step=3)


def test_tf_checkpoint_dir(tmp_path):
  with open(tmp_path / "bert_config.json", "w") as f:
    json.dump({"hidden_size": 64, "num_hidden_layers": 2}, f)
  (tmp_path / "bert_model.ckpt.index").write_bytes(b"")
  src = pretrained.resolve(str(tmp_path))
  assert src.kind == pretrained.TF
  assert pretrained.load_model_config(src).hidden_size == 64


def test_missing_or_unknown_path_is_one_clear_error(tmp_path):
  missing = str(tmp_path / "no_such_model")
  with pytest.raises(FileNotFoundError, match=f"{missing} does not exist"):
    pretrained.resolve(missing)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match=f"{empty} is none of"):
    pretrained.resolve(str(empty))
  # A run that has not saved yet (fill_mask --model on it): says so.
  (tmp_path / "fresh" / "checkpoints").mkdir(parents=True)
  with pytest.raises(FileNotFoundError,
                     match=f"{tmp_path / 'fresh'} has no checkpoint yet"):
    pretrained.resolve(str(tmp_path / "fresh"))


# -----------------------------------------------------------------------------
# The tokenizer a run used is recorded, not guessed from directory names.
# -----------------------------------------------------------------------------
def _two_tokenizers(path):
  """Two cached tokenizers that both fit the config; the second is newer."""
  files = []
  for name in ("sentencepiece-600-uncased-aaaa",
               "sentencepiece-600-uncased-bbbb"):
    d = path / "tokenizer" / name
    d.mkdir(parents=True)
    (d / "spm.model").write_bytes(name.encode())
    files.append(str(d / "spm.model"))
    time.sleep(0.01)
  os.utime(files[1], (time.time() + 10, time.time() + 10))
  return files


def test_record_names_the_tokenizer_the_run_used(workdir, tmp_path):
  src_path, _, _ = workdir
  path = tmp_path / "w"
  shutil.copytree(src_path, path)
  used, newer = _two_tokenizers(path)
  # Without a record (an old workdir) the search picks the newest.
  assert pretrained.tokenizer_spec(str(path)).path == newer
  pretrained.record_tokenizer(str(path), types.SimpleNamespace(
      kind="sentencepiece", path=used, lower_case=False))
  with open(path / "tokenizer" / "record.json") as f:
    assert json.load(f)["path"] == os.path.join(
        "tokenizer", "sentencepiece-600-uncased-aaaa", "spm.model")
  for p in (path, path / "checkpoints" / "1"):
    spec = pretrained.tokenizer_spec(str(p))
    assert (spec.kind, spec.path, spec.lower_case) == (
        "sentencepiece", used, False)
  # Stored relative to the workdir: a moved workdir still finds its own.
  moved = tmp_path / "moved"
  shutil.move(str(path), str(moved))
  assert pretrained.tokenizer_spec(str(moved)).path == os.path.join(
      str(moved), "tokenizer", "sentencepiece-600-uncased-aaaa", "spm.model")


def test_tokenizer_outside_the_workdir_is_recorded_absolute(workdir, tmp_path):
  src_path, _, _ = workdir
  path = tmp_path / "w"
  shutil.copytree(src_path, path)
  vocab = tmp_path / "shared" / "vocab.txt"
  vocab.parent.mkdir()
  vocab.write_text("[PAD]\n")
  pretrained.record_tokenizer(str(path), types.SimpleNamespace(
      kind="wordpiece", path=str(vocab), lower_case=True))
  spec = pretrained.tokenizer_spec(str(path))
  assert (spec.kind, spec.path) == ("wordpiece", str(vocab))
  assert np.isscalar(spec.lower_case) and spec.lower_case


def test_record_on_a_url_workdir():
  """gs:// workdirs go through tf.io.gfile (ram:// stands in offline)."""
  workdir = "ram://bert_jax_pretrained_test/w"
  pretrained.record_tokenizer(workdir, types.SimpleNamespace(
      kind="wordpiece", path=workdir + "/tokenizer/wp/vocab.txt",
      lower_case=True))
  record = json.loads(pretrained.read_text(
      workdir + "/tokenizer/record.json"))
  assert record == dict(kind="wordpiece", path="tokenizer/wp/vocab.txt",
                        lower_case=True)


@pytest.mark.parametrize("stored", [1.0, 0.5])
def test_older_electra_run_resolves_its_generator_temperature(tmp_path,
                                                              stored):
  """ELECTRA runs before objective.generator_temperature existed stored the
  generator's sampling temperature as objective.temperature: resolved, the
  run samples at that temperature, and objective.temperature is back to
  DistilBERT's default (the old value does not leak into it)."""
  config = config_lib.get_config("tiny").to_dict()
  config["objective"] = dict(name="electra", temperature=stored,
                             generator_hidden_size=0.5, disc_weight=50.0)
  config = ml_collections.ConfigDict(config)
  save_checkpoints(tmp_path / "old", config,
                   {1: {"embeddings": {"x": np.zeros(3, np.float32)}}})
  source = pretrained.resolve(str(tmp_path / "old"))
  assert source.objective == "electra"
  o = source.config.objective
  assert o.generator_temperature == stored
  assert o.temperature == config_lib.objective_config().temperature == 2.0
  assert o.generator_hidden_size == 0.5  # The rest as stored / default.
  assert o.generator_layers == config_lib.objective_config().generator_layers
