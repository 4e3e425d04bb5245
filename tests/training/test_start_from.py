"""A run that starts from pretrained params uses their tokenizer.

`train.init_from=W` (or a DistilBERT teacher W) brings embeddings whose row
i is W's token i. A run that trained a new tokenizer on its corpus (another
`data.tokenizer_vocab_size`, another corpus) would read them with other
ids, silently. The run takes W's tokenizer instead; a `data.tokenizer_path`
naming another one is refused at startup with one line, before anything is
written. Sources that are no BERT (a GPT-2 directory, an ELECTRA run as a
teacher) or of another width say so, naming the field.
"""

import json
import os

import pytest

from bert_jax import config_lib
from bert_jax.training import config_checks
from bert_jax.training import start_from
from tests import helpers
from tests.helpers import tiny_models
from tests.helpers.checkpoints import random_tree
from tests.helpers.checkpoints import save_checkpoints


def _bert_workdir(path, config=None, words=tiny_models.WORDS):
  """A BERT workdir (one checkpoint of random params of the tiny config)
  whose record names its own WordPiece vocab.txt."""
  from bert_jax import compose
  config = config or helpers.tiny_config()
  os.makedirs(os.path.join(path, "tokenizer"))
  vocab = os.path.join(path, "tokenizer", "vocab.txt")
  with open(vocab, "w") as f:
    f.write("\n".join(list(tiny_models.SPECIALS) + sorted(set(words))) + "\n")
  make = compose.objective(config).make_model
  save_checkpoints(path, config, {2: random_tree(lambda r: make(config, r))})
  with open(os.path.join(path, "tokenizer", "record.json"), "w") as f:
    json.dump(dict(kind="wordpiece", path="tokenizer/vocab.txt",
                   lower_case=True), f)
  return str(path), vocab


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  return _bert_workdir(tmp_path_factory.mktemp("src") / "w")


@pytest.mark.slow
def test_init_from_trains_with_the_source_tokenizer(source, tmp_path, caplog):
  """End to end: a 2-step run from W asks for a 300-piece tokenizer of its
  own; it records W's vocab.txt and trains none."""
  from bert_jax.training import trainer as trainer_lib
  w, vocab = source
  config = helpers.tiny_config(
      train=dict(init_from=w, num_steps=2, eval_every=1000),
      data=dict(tokenizer_vocab_size=300))
  workdir = tmp_path / "run"
  with caplog.at_level("INFO"):
    trainer_lib.train_and_evaluate(config, str(workdir))
  with open(workdir / "tokenizer" / "record.json") as f:
    record = json.load(f)
  assert record == dict(kind="wordpiece", path=vocab, lower_case=True)
  assert os.listdir(workdir / "tokenizer") == ["record.json"]  # None trained.
  assert f"Tokenizer: {vocab} (wordpiece, uncased), the one " in caplog.text


def test_another_tokenizer_path_is_refused_before_writing(source, tmp_path):
  from bert_jax.training import trainer as trainer_lib
  w, _ = source
  other = tmp_path / "other_vocab.txt"
  other.write_text("\n".join(tiny_models.SPECIALS + ("x", "y")) + "\n")
  config = helpers.tiny_config(train=dict(init_from=w))
  config.data.update(tokenizer_type="wordpiece", tokenizer_path=str(other))
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    trainer_lib.train_and_evaluate(config, str(workdir))
  assert str(e.value) == (
      f"data.tokenizer_path: {other} is not the tokenizer "
      f"train.init_from={w} was trained with ({w}/tokenizer/vocab.txt "
      "(wordpiece, uncased)): its embeddings would be read with other token "
      "ids. Leave data.tokenizer_path empty to use that one.")
  assert not workdir.exists()  # Refused before the workdir was taken.


def test_the_same_vocabulary_elsewhere_is_accepted(source, tmp_path):
  w, vocab = source
  copy = tmp_path / "copy.txt"
  copy.write_bytes(open(vocab, "rb").read())
  config = helpers.tiny_config(train=dict(init_from=w))
  config.data.update(tokenizer_type="wordpiece", tokenizer_path=str(copy))
  assert start_from.resolve(config, str(tmp_path / "run")) is config


def test_resumed_run_keeps_the_tokenizer_it_recorded(source, tmp_path):
  """After its first checkpoint the run uses its own record (W may be gone
  or changed by then)."""
  w, _ = source
  mine, my_vocab = _bert_workdir(tmp_path / "run", words=("a", "b"))
  config = helpers.tiny_config(train=dict(init_from=w))
  assert start_from.resolve(config, mine).data.tokenizer_path == my_vocab
  fresh = start_from.resolve(config, str(tmp_path / "new"))
  assert fresh.data.tokenizer_path == source[1]


def test_teacher_and_init_from_with_other_tokenizers(source, tmp_path):
  w, _ = source
  other, _ = _bert_workdir(tmp_path / "other", words=("a", "b"))
  config = helpers.tiny_config(train=dict(init_from=w))
  config.objective.update(name="distil", teacher=other, student_layers=1)
  config.data.update(objective="packed", nsp=False)
  with pytest.raises(ValueError, match=(
      f"train.init_from: {w} and objective.teacher={other} were trained with "
      "different tokenizers")):
    start_from.resolve(config, str(tmp_path / "run"))


def test_gpt2_directory_says_what_it_is(tmp_path):
  d = tmp_path / "gpt2"
  d.mkdir()
  (d / "config.json").write_text(json.dumps(
      {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
  (d / "model.safetensors").write_bytes(b"")
  config = helpers.tiny_config(train=dict(init_from=str(d)))
  with pytest.raises(ValueError) as e:
    start_from.resolve(config, str(tmp_path / "run"))
  assert str(e.value) == (
      f"train.init_from: {d} is a Hugging Face 'gpt2' model "
      "(GPT2LMHeadModel), not an encoder bert_jax reads (model_type 'albert',"
      " 'bert', 'distilbert', 'electra', 'modernbert', 'roberta', "
      "'xlm-roberta').")


def _distil(teacher, **model):
  config = helpers.tiny_config(model=model)
  config.objective.update(name="distil", teacher=teacher, student_layers=1)
  config.data.update(objective="packed", nsp=False)
  return config


def test_teacher_of_another_width_names_the_teacher(source):
  w, _ = source
  with pytest.raises(ValueError) as e:
    config_checks.validate(_distil(w, hidden_size=128), 1)
  assert str(e.value) == (
      f"objective.teacher: {w} has model.hidden_size=64, but the config has "
      "model.hidden_size=128 (the teacher's architecture, which the "
      "student's derives from); set --config.model.hidden_size=64.")
  config_checks.validate(_distil(w), 1)  # The teacher's width: fine.


def test_electra_workdir_as_teacher_says_what_it_is(tmp_path):
  electra = helpers.tiny_config()
  electra.objective.name = "electra"
  electra.data.update(objective="packed", nsp=False)
  w, _ = _bert_workdir(tmp_path / "electra", config=electra)
  with pytest.raises(ValueError) as e:
    config_checks.validate(_distil(w), 1)
  assert str(e.value) == (
      f"objective.teacher: {w} holds the model of a 'electra' run (workdir), "
      "not a BERT: the teacher must be a BERT (a BERT pretraining workdir, "
      "or a BertForPreTraining / BertForMaskedLM directory).")
  assert config_lib.get_config("tiny").objective.teacher == ""


def test_init_from_of_another_width_is_refused_at_startup(source, tmp_path):
  """Refused at startup, naming the field, before the data pipeline is
  built or a step compiled."""
  w, _ = source
  config = helpers.tiny_config(train=dict(init_from=w),
                               model=dict(hidden_size=128))
  with pytest.raises(ValueError) as e:
    start_from.resolve(config, str(tmp_path / "run"))
  assert str(e.value) == (
      f"train.init_from: {w} has model.hidden_size=64, but the config has "
      "model.hidden_size=128; set --config.model.hidden_size=64.")


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory):
  """A ModernBERT directory whose only tokenizer is a byte-level BPE
  tokenizer.json, and a WordPiece vocab.txt of the same tokens."""
  return tiny_models.make_byte_level_modernbert_dir(
      str(tmp_path_factory.mktemp("byte_level")))


def test_tokenizer_of_other_ids_than_a_tokenizer_json_is_refused(byte_level,
                                                                 tmp_path):
  """The vocab.txt holds the BPE's tokens, but WordPiece splits text into
  other ids: refused at startup, naming both, nothing written."""
  from bert_jax.training import trainer as trainer_lib
  out, vocab = byte_level["out"], byte_level["vocab_path"]
  config = byte_level["config"].copy_and_resolve_references()
  config.train.init_from = out
  config.data.update(tokenizer_type="wordpiece", tokenizer_path=vocab)
  workdir = tmp_path / "run"
  with pytest.raises(ValueError) as e:
    trainer_lib.train_and_evaluate(config, str(workdir))
  message = str(e.value)
  assert message.startswith(
      f"data.tokenizer_path: {vocab} is not the tokenizer train.init_from="
      f"{out} was trained with ({out}/tokenizer.json, a byte-level BPE): on "
      "a probe text it gives "), message
  assert message.endswith("so its embeddings would be read with other token "
                          "ids."), message
  assert len(message.splitlines()) == 1
  assert not workdir.exists()


def test_byte_level_source_without_a_tokenizer_path_runs_its_own(
    byte_level, tmp_path):
  """A directory whose only tokenizer is a byte-level BPE tokenizer.json
  gives the run that file (hf_json, run host-side)."""
  out = byte_level["out"]
  config = byte_level["config"].copy_and_resolve_references()
  config.train.init_from = out
  data = start_from.resolve(config, str(tmp_path / "run")).data
  assert (data.tokenizer_type, data.tokenizer_path) == (
      "hf_json", os.path.join(out, "tokenizer.json"))


def _minilm_with_tokenizer_json_only(tmp_path):
  """The real MiniLM directory without its vocab.txt (as transformers 5
  saves a BERT): config, weights, tokenizer.json and its config."""
  from bert_jax import pretrained
  from tests.helpers.checkpoints import minilm_dir
  src, d = minilm_dir(), tmp_path / "minilm"
  d.mkdir()
  for name in ("config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json"):
    os.symlink(os.path.join(src, name), d / name)
  config = helpers.tiny_config(train=dict(init_from=str(d)))
  config.model.update(pretrained.load_model_config(str(d)).to_dict())
  return str(d), os.path.join(src, "vocab.txt"), config


def test_tokenizer_with_the_ids_of_a_tokenizer_json_is_accepted(tmp_path):
  """MiniLM's own vocab.txt tokenizes the probe text as its tokenizer.json
  does: accepted; read cased it gives other ids: refused."""
  d, vocab, config = _minilm_with_tokenizer_json_only(tmp_path)
  config.data.update(tokenizer_type="wordpiece", tokenizer_path=vocab,
                     lower_case=True)
  assert start_from.resolve(config, str(tmp_path / "run")) is config
  config.data.lower_case = False
  with pytest.raises(ValueError, match=(
      f"data.tokenizer_path: {vocab} is not the tokenizer "
      f"train.init_from={d} was trained with \\({d}/tokenizer.json, a "
      "WordPiece\\): on a probe text")):
    start_from.resolve(config, str(tmp_path / "run"))

