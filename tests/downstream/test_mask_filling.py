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


def test_cli_errors_are_one_line(exported, tmp_path):
  from tests.helpers import failure_lines
  from tests.helpers import in_process
  r = in_process.run_module("fill_mask", "--model", exported["out"],
                            "No mask here.")
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


# --- Files of texts: packed rows --------------------------------------------
def _lines(runner, n: int = 40) -> list[str]:
  """Texts of many lengths with one or more masks: short ones that share
  rows, ones longer than a 32-token row (its rows grow) and past the
  model's 64 positions (windowed around the masks)."""
  corpus = _corpus()
  r = np.random.RandomState(0)
  mask = runner.tokenizer.mask_token
  out = list(TEXTS)
  for i in range(n):
    words = " ".join(corpus[(7 * i + j) % len(corpus)] for j in range(
        1 + i % 4)).split()[:int(r.choice([4, 8, 20, 60, 120]))] or ["x"]
    for _ in range(1 + (i % 7 == 0) * 2):
      words.insert(r.randint(0, len(words) + 1), mask)
    out.append(" ".join(words))
  return out


def _same_results(got, want, text):
  rows = [got, want] if got and isinstance(got[0], dict) else None
  got, want = ([got], [want]) if rows else (got, want)
  assert len(got) == len(want), text
  for g_row, w_row in zip(got, want):
    assert [(r["token"], r["token_str"], r["sequence"]) for r in g_row] == [
        (r["token"], r["token_str"], r["sequence"]) for r in w_row], text
    np.testing.assert_allclose([r["score"] for r in g_row],
                               [r["score"] for r in w_row], rtol=1e-5,
                               atol=1e-7, err_msg=text)


def test_a_file_of_texts_on_packed_rows_gives_each_texts_own_results(
    exported, tmp_path):
  runner = mask_filling.FillMask(*mask_filling.load(exported["out"]))
  lines = _lines(runner)
  lengths = [len(runner.tokenizer.tokenizer.encode(t).ids) for t in lines]
  assert min(lengths) < 16 and 32 < max(lengths[:-8]) and max(lengths) > 64
  path = tmp_path / "texts.txt"
  path.write_text("\n".join(lines) + "\n")
  out = str(tmp_path / "out.jsonl")
  # Small rows and chunks: several batches, rows of 32 and longer, a
  # chunk boundary.
  chunk, mask_filling.CHUNK_LINES = mask_filling.CHUNK_LINES, 17
  try:
    assert fill_mask.main(["--model", exported["out"], "--top_k", "3",
                           "--input", str(path), "--output", out,
                           "--seq_length", "32", "--max_sequences", "4",
                           "--batch_size", "3"]) == 0
  finally:
    mask_filling.CHUNK_LINES = chunk
  with open(out) as f:
    got = [json.loads(line) for line in f]
  assert len(got) == len(lines)
  for text, result in zip(lines, got):
    _same_results(result, runner(text, top_k=3), text)


def test_a_line_without_a_mask_is_named_and_nothing_is_written(
    exported, tmp_path, capsys):
  path = tmp_path / "texts.txt"
  path.write_text(f"{TEXTS[0]}\n{TEXTS[1]}\nNo mask here.\n{TEXTS[2]}\n")
  out = tmp_path / "out.jsonl"
  assert fill_mask.main(["--model", exported["out"], "--input", str(path),
                         "--output", str(out)]) == 1
  (line,) = capsys.readouterr().err.strip().splitlines()
  assert line == (f"error: --input {path} line 3: The text has no [MASK] "
                  "token: put [MASK] where the word to predict goes, e.g. "
                  "\"Paris is the [MASK] of France.\"")
  assert os.listdir(tmp_path) == ["texts.txt"]


@pytest.mark.parametrize("family", ["albert", "electra", "modernbert"])
def test_every_familys_masked_lm_fills_packed_rows(exported, family):
  """The other families' masked LMs (ALBERT's, ELECTRA's generator,
  ModernBERT's) read packed rows: each text's results are its own."""
  from flax import nnx

  from tests import helpers
  from tests.helpers import family_checks
  if exported["kind"] != "wordpiece":
    pytest.skip("one tokenizer is enough: the rows are the model's")
  if family == "electra":
    config = helpers.sharded_config()
    config.objective.name = "electra"
  else:
    config = family_checks.family_config(family)
  config.model.vocab_size = int(exported["config"].model.vocab_size)
  model = compose.objective(config).make_model(config, nnx.Rngs(0))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  mlm = compose.masked_lm(config, params)
  tok = pretrained.load_tokenizer(pretrained.resolve(exported["out"]))
  runner = mask_filling.FillMask(mlm.params, mlm.model_config, tok,
                                 mlm.table)
  lines = _lines(runner, 12)
  got = runner.fill_many(lines, 3, seq_length=32, max_sequences=4,
                         batch_size=2)
  for text, result in zip(lines, got):
    _same_results(result, runner(text, top_k=3), text)
