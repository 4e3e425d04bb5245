"""Exports leave out the vocabulary rows past the tokenizer.

A run's table may be padded past its tokenizer (the default 30,522 rows with
a ~4,000-piece SentencePiece model). Those rows are no token: bert_jax's
fill_mask never predicts them; Hugging Face's fill-mask pipeline would, as
empty strings, if the export kept them. Each family's run here has a 128-row table, an 89-token
WordPiece tokenizer and padded rows whose MLM bias would win every
prediction; its export must say vocab_size 89 and answer as fill_mask does
(tokens and scores within 1e-4), on the workdir and on the export alike.
"""

import json
import os

import numpy as np
import pytest

from bert_jax import export
from bert_jax import compose
from bert_jax import pretrained
from bert_jax.downstream import mask_filling
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files
from bert_jax.hf import vocab
from tests import helpers
from tests.helpers import tiny_models
from tests.helpers.checkpoints import random_tree
from tests.helpers.checkpoints import save_checkpoints

transformers = pytest.importorskip("transformers")

ROWS = 128
TEXT = "i [MASK] the film and the plot ."


def _config(family: str, vocab_path: str):
  c = helpers.tiny_config(model=dict(
      vocab_size=ROWS, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=32))
  c.data.update(tokenizer_type="wordpiece", tokenizer_path=vocab_path,
                lower_case=True)
  if family == "albert":
    c.objective.name = "albert"
    c.model.update(embedding_size=16, hidden_act="gelu_new")
    c.data.update(objective="sop")
  elif family == "electra":
    c.objective.name = "electra"
    c.data.update(objective="packed", nsp=False)
  elif family == "distil":
    c.objective.update(name="distil", teacher="random", student_layers=1)
    c.data.update(objective="packed", nsp=False)
  return c


def _padded_run(base: str, family: str, workdir: bool = True):
  """A run whose padded rows would win every prediction: (its workdir, or
  "" with `workdir` False, tokenizer size, params, config)."""
  vocab_path = os.path.join(base, "vocab.txt")
  n_tok = len(tiny_models.write_vocab(vocab_path))
  config = _config(family, vocab_path)
  make = compose.objective(config).make_model
  flat = mapping.flatten_params(random_tree(lambda r: make(config, r)))
  rng = np.random.default_rng(0)
  for k in flat:
    if k.endswith("mlm_head.bias"):
      flat[k] = rng.normal(0, 2.0, ROWS).astype(np.float32)
      flat[k][n_tok:] = 8.0  # Far above every real token's logit.
  params = mapping.unflatten_params(flat)
  path = os.path.join(base, "run") if workdir else ""
  if workdir:
    save_checkpoints(path, config, {3: params})
  return path, n_tok, params, config


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "albert", "distil", "electra"])
def test_fill_mask_pipeline_agrees_with_ours_on_a_padded_run(tmp_path,
                                                             family):
  # A workdir for two families (BERT's tree, ELECTRA's pair); the others
  # are exported from their params (the same writer).
  workdir, n_tok, params, config = _padded_run(
      str(tmp_path), family, workdir=family in ("bert", "electra"))
  out = str(tmp_path / "hf")
  if workdir:
    export.export_run(workdir, out)
  else:
    export.write_hf_models(out, params, config,
                           tokenizer=tokenizer_files.TokenizerSpec(
                               "wordpiece", config.data.tokenizer_path, True))
  dirs = ([os.path.join(out, d) for d in ("discriminator", "generator")]
          if family == "electra" else [out])
  for d in dirs:
    with open(os.path.join(d, "config.json")) as f:
      assert json.load(f)["vocab_size"] == n_tok, d
    assert len(transformers.AutoTokenizer.from_pretrained(d)) == n_tok
  pipe = transformers.pipeline("fill-mask", model=dirs[-1])
  assert pipe.model.config.vocab_size == n_tok
  theirs = pipe(TEXT, top_k=5)
  assert all(r["token_str"].strip() for r in theirs), theirs
  for path in (workdir, out) if workdir else (out,):
    ours = mask_filling.fill_mask(path, TEXT, top_k=5)
    assert [r["token"] for r in ours] == [r["token"] for r in theirs], path
    assert [r["token_str"] for r in ours] == [r["token_str"] for r in theirs]
    np.testing.assert_allclose([r["score"] for r in ours],
                               [r["score"] for r in theirs], atol=1e-4)


def test_trimmed_export_loads_back_into_the_padded_config(tmp_path):
  """Starting a padded run from a trimmed export: the tokenizer's rows
  exactly, rows that are no token added back."""
  workdir, n_tok, params, config = _padded_run(str(tmp_path), "bert")
  out = str(tmp_path / "hf")
  export.export_run(workdir, out)
  back, report = pretrained.load_params(out, config.model)
  assert vocab.rows(back) == ROWS
  assert any(f"padded from {n_tok} to {ROWS}" in n for n in report.notes), (
      report.notes)
  ours, theirs = mapping.flatten_params(params), mapping.flatten_params(back)
  assert sorted(ours) == sorted(theirs)
  for k, x in ours.items():
    y = theirs[k]
    if k.endswith(vocab.ROW_PARAMS):
      np.testing.assert_array_equal(y[:n_tok], x[:n_tok], err_msg=k)
      if k.endswith("bias"):
        assert not np.any(y[n_tok:])
    else:
      np.testing.assert_array_equal(y, x, err_msg=k)


def test_export_files_are_readable_by_others(tmp_path):
  """model.safetensors is written like the other files (0644 under the
  usual umask), not 0600."""
  workdir, _, _, _ = _padded_run(str(tmp_path), "bert")
  out = str(tmp_path / "hf")
  old = os.umask(0o022)
  try:
    export.export_run(workdir, out)
  finally:
    os.umask(old)
  modes = {f: oct(os.stat(os.path.join(out, f)).st_mode & 0o777)
           for f in os.listdir(out)}
  assert set(modes.values()) == {"0o644"}, modes
