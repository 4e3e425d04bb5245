"""bert_jax.fill_mask: same answers as transformers' pipeline("fill-mask").

The end-to-end check on a model trained here (workdir and its export) is in
tests/hf/test_export_import.py::test_fill_mask_cli_workdir_and_hf_dir_agree_with_pipeline.
"""

import json
import os

import numpy as np
import pytest

from bert_jax import compose
from bert_jax import config_lib
from bert_jax import fill_mask
from bert_jax import pretrained
from bert_jax.downstream import mask_filling
from bert_jax.families import bert as bert_family
from bert_jax.hf import checkpoint_io
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files

TEXTS = [
    "Elephants are playing in the zoo with monkeys. The story is about [MASK].",
    "The [MASK] returns a list of values.",
    "Use the [MASK] statement to define a [MASK].",  # Two masks.
]


def _corpus():
  import pydoc_data.topics
  return [l for t in pydoc_data.topics.topics.values()
          for l in t.split("\n") if l.strip()][:3000]


@pytest.fixture(scope="module", params=["sentencepiece", "wordpiece"])
def exported(request, tmp_path_factory):
  """A random tiny model with a trained tokenizer, exported to an HF dir."""
  from flax import nnx

  from bert_jax.data import tokenizers
  from bert_jax.models import bert as bert_model
  kind = request.param
  base = tmp_path_factory.mktemp(kind)
  tok_dir = base / "workdir" / "tokenizer" / f"{kind}-600-uncased-0"
  os.makedirs(tok_dir)
  if kind == "sentencepiece":
    path = str(tok_dir / "spm.model")
    with open(path, "wb") as f:
      f.write(tokenizers.train_sentencepiece(iter(_corpus()), 600))
  else:
    path = str(tok_dir / "vocab.txt")
    tokenizers.save_wordpiece(
        tokenizers.train_wordpiece(iter(_corpus()), 600), path)
  ingraph = tokenizers.load(path, kind, True)
  config = config_lib.get_config("tiny")
  config.data.tokenizer_type = kind
  config.data.tokenizer_vocab_size = 600
  config.model.update(vocab_size=ingraph.vocab_size, hidden_size=64,
                      num_attention_heads=2, intermediate_size=128,
                      max_position_embeddings=64)
  m = bert_model.BertForPreTraining(config.model, rngs=nnx.Rngs(0))
  flat = mapping.flatten_params(nnx.to_pure_dict(nnx.state(m, nnx.Param)))
  flat = {k: np.asarray(v, np.float32) for k, v in flat.items()}
  # A peaked, well-separated output distribution: no near-ties in the top-k.
  flat["mlm_head.bias"] = np.random.default_rng(0).normal(
      0, 2.0, flat["mlm_head.bias"].shape).astype(np.float32)
  params = mapping.unflatten_params(flat)
  out = str(base / "hf")
  checkpoint_io.save_hf_model(out, params, config.model,
      tokenizer=tokenizer_files.TokenizerSpec(kind, path, True), table=bert_family.BERT)
  return dict(kind=kind, out=out, workdir=str(base / "workdir"),
              params=params, config=config)


def test_agrees_with_transformers_pipeline(exported):
  import transformers
  pipe = transformers.pipeline("fill-mask", model=exported["out"])
  runner = mask_filling.FillMask(*mask_filling.load(exported["out"]))
  for text in TEXTS:
    got, expected = runner(text, top_k=5), pipe(text, top_k=5)
    if isinstance(expected[0], dict):
      got, expected = [got], [expected]
    assert len(got) == len(expected)
    for g_row, e_row in zip(got, expected):
      assert [(r["token"], r["token_str"], r["sequence"]) for r in g_row] == [
          (r["token"], r["token_str"], r["sequence"]) for r in e_row]
      np.testing.assert_allclose([r["score"] for r in g_row],
                                 [r["score"] for r in e_row], rtol=1e-5,
                                 atol=1e-7)


@pytest.mark.slow
def test_workdir_and_hf_dir_give_identical_results(exported):
  from tests.helpers.checkpoints import save_checkpoints
  # A real checkpoint (step 7) beside the cached tokenizer: a training workdir.
  save_checkpoints(exported["workdir"], exported["config"],
                   {7: exported["params"]})
  from_workdir = mask_filling.fill_mask(exported["workdir"], TEXTS[0], top_k=4)
  from_hf = mask_filling.fill_mask(exported["out"], TEXTS[0], top_k=4)
  assert from_workdir == from_hf
  assert len(from_hf) == 4
  assert sorted(from_hf[0]) == ["score", "sequence", "token", "token_str"]
  scores = [r["score"] for r in from_hf]
  assert scores == sorted(scores, reverse=True) and 0 < scores[0] <= 1


@pytest.mark.slow
def test_cli_json_and_text_output(exported, capsys):
  fill_mask.main(["--model", exported["out"], "--top_k", "3", "--json",
                  TEXTS[0]])
  res = json.loads(capsys.readouterr().out)
  assert len(res) == 3 and isinstance(res[0]["score"], float)
  fill_mask.main(["--model", exported["out"], "--top_k", "3", TEXTS[2]])
  printed = capsys.readouterr().out
  assert "[MASK] #2:" in printed and res[0]["token_str"] not in ("",)
  fill_mask.main(["--model", exported["out"], "--json", TEXTS[2]])
  two = json.loads(capsys.readouterr().out)
  assert len(two) == 2 and len(two[0]) == 5  # A list per mask.


def test_text_without_mask_is_an_error(exported):
  runner = mask_filling.FillMask(*mask_filling.load(exported["out"]))
  with pytest.raises(ValueError, match="MASK"):
    runner("No mask here.")


@pytest.mark.slow
def test_vocab_txt_only_directory(exported, tmp_path):
  """An HF dir with vocab.txt and no tokenizer.json (older BERT releases)."""
  if exported["kind"] != "wordpiece":
    pytest.skip("WordPiece only")
  import shutil
  d = str(tmp_path / "old")
  shutil.copytree(exported["out"], d)
  os.remove(os.path.join(d, "tokenizer.json"))
  os.remove(os.path.join(d, "tokenizer_config.json"))
  assert mask_filling.fill_mask(d, TEXTS[1]) == mask_filling.fill_mask(
      exported["out"], TEXTS[1])


@pytest.mark.slow
def test_padded_vocab_rows_are_never_predicted(exported):
  """An embedding table padded past the tokenizer: those ids are no token."""
  params, model_config, tok, _ = mask_filling.load(exported["out"])
  n = tok.tokenizer.get_vocab_size()
  assert int(model_config.vocab_size) == n
  flat = {k: np.asarray(v) for k, v in
          mapping.flatten_params(params).items()}
  pad = 8
  for k, v in flat.items():  # word embeddings and the MLM bias: vocab rows
    if v.shape[0] == n:
      flat[k] = np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
  # Padded rows that would win every prediction if they were not masked.
  flat["mlm_head.bias"][n:] = 100.0
  padded = model_config.copy_and_resolve_references()
  padded.vocab_size = n + pad
  runner = mask_filling.FillMask(mapping.unflatten_params(flat), padded, tok)
  rows = runner(TEXTS[0], top_k=n + pad)
  assert len(rows) == n and all(r["token"] < n for r in rows)
  # Scores are the softmax over the tokenizer's rows (an export has no
  # others, so HF's pipeline computes the same): the padded rows, which
  # would hold almost all the mass, take none.
  np.testing.assert_allclose(sum(r["score"] for r in rows), 1.0, rtol=1e-5)
  assert rows == mask_filling.FillMask(params, model_config, tok)(
      TEXTS[0], top_k=n)
  assert rows[0]["token_str"] != ""


def test_text_longer_than_the_model_keeps_the_mask(exported, caplog):
  runner = mask_filling.FillMask(*mask_filling.load(exported["out"]))
  words = " ".join(f"word{i}" for i in range(120))
  text = f"{words} the [MASK] returns a list of values. {words}"
  assert len(runner.tokenizer.tokenizer.encode(text).ids) > 64
  with caplog.at_level("WARNING"):
    rows = runner(text, top_k=3)
  assert len(rows) == 3 and all("returns a list" in r["sequence"]
                                for r in rows)
  assert "more than the model's 64 positions" in caplog.text
  too_far = f"[MASK] {words} [MASK]"
  with pytest.raises(ValueError, match="max_position_embeddings"):
    runner(too_far)


@pytest.mark.slow
def test_cli_errors_are_one_line(exported, tmp_path):
  import subprocess
  import sys

  from tests.helpers import child_env
  from tests.helpers import failure_lines
  r = subprocess.run(
      [sys.executable, "-m", "bert_jax.fill_mask", "--model", exported["out"],
       "No mask here."], env=child_env(), capture_output=True, text=True,
      timeout=300)
  (line,) = failure_lines(r)
  assert line.startswith("error: The text has no [MASK] token"), line


def _refusal(capsys, model: str) -> str:
  """fill_mask's exit status and stderr for --model: one line, exit 1."""
  assert fill_mask.main(["--model", model, "The [MASK] returns."]) == 1
  captured = capsys.readouterr()
  assert not captured.out
  (line,) = captured.err.strip().splitlines()
  return line


def test_directory_without_mlm_head_is_refused(capsys):
  """The shipped MiniLM (a BertModel: no MLM head) is refused as zero_shot
  refuses it, instead of predicting from a freshly initialised head."""
  from tests.helpers.checkpoints import minilm_dir
  path = minilm_dir()
  assert _refusal(capsys, path) == (
      f"error: --model={path} has no masked-LM head (a BertModel "
      "checkpoint, e.g. sentence-transformers'): filling masks needs one "
      "trained with MLM (a pretraining workdir or a BertForMaskedLM / "
      "BertForPreTraining directory).")


def test_fine_tuned_workdir_is_one_line(tmp_path, capsys):
  from bert_jax.models import bert as bert_model
  from tests import helpers
  from tests.helpers import tiny_models
  from tests.helpers.checkpoints import random_tree
  from tests.helpers.checkpoints import save_checkpoints
  vocab_path = str(tmp_path / "vocab.txt")
  n = len(tiny_models.write_vocab(vocab_path))
  config = helpers.load_config("finetune")
  config.model = tiny_models.tiny_model_config(n).model
  config.data.update(tokenizer_type="wordpiece", tokenizer_path=vocab_path)
  config.train.init_from = "/runs/pretrained"
  workdir = str(tmp_path / "ft")
  save_checkpoints(workdir, config, {4: random_tree(
      lambda r: compose.task_objective("sentence", "bert").make_model(
          config, r))})
  assert _refusal(capsys, workdir) == (
      f"error: --model={workdir}: A 'classify' run holds no masked-LM head "
      "(its models: BertForSequenceClassification): nothing to fill masks "
      "with. Fill masks with the model it was fine-tuned from: "
      "/runs/pretrained.")
