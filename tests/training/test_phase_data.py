"""A phase's "data" entry: the mask rate and the source mixture per phase,
measured from the batches each phase's pipeline gives, and the refusals.

The corpus: three sources whose documents use disjoint words ("a3 a17 ...",
"b5 ...", "c0 ..."), 300, 100 and 50 documents, and a WordPiece vocabulary
of exactly those words, so every token names its source. Rows are whole
sentences of one document (objective "packed", no packing): each row is one
source's.
"""

import os

import numpy as np
import pytest

from tests import helpers
from tests.helpers import in_process

SOURCES = {"a": 300, "b": 100, "c": 50}  # name -> documents
SEQ = 64
BATCHES = 60  # Per phase: 960 rows.


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  from bert_jax.data import demo_corpus
  from bert_jax.data import tokenizers
  d = tmp_path_factory.mktemp("mix")
  rng = np.random.default_rng(0)
  words = []
  for name, docs in SOURCES.items():
    vocab = [f"{name}{j}" for j in range(40)]
    words += vocab
    documents = [[" ".join(rng.choice(vocab, size=rng.integers(4, 12)))
                  for _ in range(rng.integers(2, 8))] for _ in range(docs)]
    for k in range(2):
      demo_corpus.write_documents(str(d / f"{name}-{k}.txt"), documents[k::2])
  pieces = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] +
            ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)
  path = str(d / "vocab.txt")
  tokenizers.save_wordpiece(pieces, path)
  tok = tokenizers.load(path, tokenizers.WORDPIECE, lower_case=True)
  source_of = np.full(len(pieces), -1)
  for i, piece in enumerate(pieces):
    if piece[0] in SOURCES and not piece.startswith("[") and piece[1:].isdigit():
      source_of[i] = list(SOURCES).index(piece[0])
  return dict(dir=str(d), tok=tok, source_of=source_of)


def _glob(corpus, name):
  return os.path.join(corpus["dir"], f"{name}-*.txt")


def _config(corpus, phases, **data):
  config = helpers.tiny_config(
      model=dict(vocab_size=512, max_position_embeddings=SEQ),
      data=dict(tokenizer_type="wordpiece", tokenizer_path=corpus["tok"].path,
                objective="packed", nsp=False, seq_length=SEQ,
                max_predictions_per_seq=20, eval_fraction=0.0,
                shuffle_buffer=64, block_lines=64, **data),
      train=dict(num_steps=sum(p["num_steps"] for p in phases),
                 batch_size=16, phases=tuple(phases)))
  return config


def _phase(num_steps=10, **data):
  return dict(num_steps=num_steps, seq_length=SEQ,
              max_predictions_per_seq=20, batch_size=16, data=data)


def _phase_batches(config, corpus, workdir):
  """{phase index: (batches of its pipeline, its iterator)}."""
  from bert_jax.data import pipeline
  from bert_jax.training import config_checks
  from bert_jax.training import phases as phases_lib
  out = {}
  for phase in config_checks.validate(config, num_devices=1):
    pc = phases_lib.phase_config(config, phase)
    it = pipeline.create_train_iterator(pc, corpus["tok"], workdir)
    out[phase.index] = ([next(it) for _ in range(BATCHES)], it)
  return out


# ------------------------------------------------------------------------------
# Measured from the batches.
# ------------------------------------------------------------------------------
@pytest.mark.slow
def test_mask_rate_per_phase_is_the_configured_one(corpus, tmp_path):
  """30% -> 15% -> 5% (mmBERT's decay): predicted positions over the
  tokens that can be masked (real, not special), within 0.5 points."""
  from bert_jax.data import masking
  rates = (0.30, 0.15, 0.05)
  config = _config(corpus, [_phase(mask_rate=r) for r in rates],
                   train_files=_glob(corpus, "a"))
  special = np.zeros(512, bool)
  special[corpus["tok"].special_ids] = True
  for index, (batches, _) in _phase_batches(config, corpus,
                                            str(tmp_path)).items():
    masked = sum(float(b["masked_lm_weights"].sum()) for b in batches)
    maskable = sum(int(((b["input_mask"] > 0)
                        & ~special[masking.unmasked_ids(b)]).sum())
                   for b in batches)
    assert abs(masked / maskable - rates[index]) < 0.005, (
        index, masked / maskable)


@pytest.mark.slow
def test_source_mixture_per_phase_is_the_configured_one(corpus, tmp_path):
  """Phase 1: weights 1:1:2; phase 2: temperature 2 over the sources'
  bytes (p ~ sqrt(bytes)); phase 3: two sources by size (T = 1). Each row's
  source read from its words; the iterator's examples-by-source counters
  count the same rows."""
  from bert_jax.data import iterator
  from bert_jax.data import masking
  g = {name: _glob(corpus, name) for name in SOURCES}
  config = _config(corpus, [
      _phase(sources=f"{g['a']}@1;{g['b']}@1;{g['c']}@2"),
      _phase(sources=f"{g['a']};{g['b']};{g['c']}", source_temperature=2.0),
      _phase(sources=f"{g['a']};{g['c']}", source_temperature=1.0)],
                   train_files=g["a"])
  size = {name: sum(os.path.getsize(os.path.join(corpus["dir"], f))
                    for f in os.listdir(corpus["dir"])
                    if f.startswith(name + "-")) for name in SOURCES}
  expected = [
      {"a": 0.25, "b": 0.25, "c": 0.5},
      {k: np.sqrt(size[k]) / sum(np.sqrt(v) for v in size.values())
       for k in SOURCES},
      {"a": size["a"] / (size["a"] + size["c"]), "b": 0.0,
       "c": size["c"] / (size["a"] + size["c"])}]
  assert expected[1]["a"] < 0.6 < size["a"] / sum(size.values())  # Flatter.
  for index, (batches, it) in _phase_batches(config, corpus,
                                             str(tmp_path)).items():
    rows = {k: 0 for k in SOURCES}
    for b in batches:
      for row in masking.unmasked_ids(b):
        sources = set(corpus["source_of"][row]) - {-1}
        assert len(sources) == 1, sources  # A row is one source's.
        rows[list(SOURCES)[sources.pop()]] += 1
    total = sum(rows.values())
    measured = {k: v / total for k, v in rows.items()}
    for k in SOURCES:
      assert abs(measured[k] - expected[index][k]) < 0.04, (
          index, measured, expected[index])
    counted = {name.split("/")[-1][0]: n for name, n in it.stats.items()
               if name.startswith(iterator.SOURCE_PREFIX)}
    assert counted == {k: v for k, v in rows.items() if expected[index][k]}


# ------------------------------------------------------------------------------
# What a phase may not say: one line naming the field.
# ------------------------------------------------------------------------------
@pytest.mark.parametrize("data, message", [
    (dict(mask_prob=0.3),
     r"^train.phases\[1\].data sets \['mask_prob'\]: a phase may change "
     r"only mask_rate, "),
    (dict(packing=True), r"^train.phases\[1\].data sets \['packing'\]"),
    (dict(mask_rate="0.3"),
     r"^train.phases\[1\].data.mask_rate='0.3' must be a number\.$"),
    (dict(whole_word_mask=1),
     r"^train.phases\[1\].data.whole_word_mask=1 must be a bool\.$"),
    (dict(mask_rate=0.0),
     r"^Phase 1 of the run .*data.mask_rate=0.0 must be in \(0, 1\]\.$"),
    (dict(source_temperature=-1.0),
     r"^Phase 1 of the run .*data.source_temperature=-1.0 must be >= 0"),
])
@pytest.mark.slow
def test_bad_phase_data_is_one_line_naming_the_field(corpus, data, message):
  from bert_jax.training import config_checks
  config = _config(corpus, [_phase(), _phase(**data)],
                   train_files=_glob(corpus, "a"))
  with pytest.raises(ValueError, match=message) as e:
    config_checks.validate(config, num_devices=1)
  assert len(str(e.value).splitlines()) == 1


@pytest.mark.slow
def test_phase_source_that_matches_nothing_is_refused_naming_the_phase(
    corpus, tmp_path):
  """The run refuses it before it writes anything: one line, no file."""
  workdir = tmp_path / "run"
  missing = os.path.join(corpus["dir"], "d-*.txt")
  phases = ("({'num_steps': 2, 'seq_length': 32, 'max_predictions_per_seq': 5,"
            " 'batch_size': 16}, {'num_steps': 2, 'seq_length': 32, "
            "'max_predictions_per_seq': 5, 'batch_size': 16, 'data': "
            f"{{'sources': '{_glob(corpus, 'a')};{missing}@2'}}}})")
  result = in_process.run_main(workdir, "--config.train.num_steps=4",
                               f"--config.train.phases={phases}")
  line = helpers.failure_lines(result, max_lines=2)[-1]
  assert line == (f"error: train.phases[1].data.sources: no file matches "
                  f"{missing!r}."), line
  assert not workdir.exists() or helpers.written_files(workdir) == []


@pytest.mark.slow
def test_inspect_data_prints_a_phase_s_measured_mask_rate_and_mixture(
    corpus, tmp_path):
  """tools/inspect_data.py --phase 2: that phase's masking and sources."""
  import re
  g = {name: _glob(corpus, name) for name in SOURCES}
  phases = (_phase(num_steps=2), _phase(
      num_steps=2, mask_rate=0.3, sources=f"{g['a']}@1;{g['c']}@3"))
  result = helpers.run_tool(
      "inspect_data.py",
      f"--config={os.path.join(helpers.REPO, 'bert_jax', 'config_lib.py')}"
      ":tiny", "--config.model.vocab_size=512",
      "--config.model.max_position_embeddings=64",
      "--config.data.tokenizer_type=wordpiece",
      f"--config.data.tokenizer_path={corpus['tok'].path}",
      f"--config.data.train_files={g['a']}", "--config.data.nsp=False",
      "--config.data.objective=packed", "--config.data.eval_fraction=0.0",
      f"--config.data.seq_length={SEQ}",
      "--config.data.max_predictions_per_seq=20",
      "--config.train.batch_size=16", "--config.train.num_steps=4",
      f"--config.train.phases={phases!r}", "--phase=2", "--num_batches=40",
      "--num_show=0", f"--workdir={tmp_path}", timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  rate = re.search(r"mask rate: ([0-9.]+)% of the maskable tokens "
                   r"\(data.mask_rate 30%\)", result.stdout)
  assert rate and abs(float(rate.group(1)) - 30) < 0.5, result.stdout
  shares = dict(re.findall(r"examples from text:\S+/([ac])-\*\.txt: \d+ "
                           r"\(([0-9.]+)%; weight", result.stdout))
  assert sorted(shares) == ["a", "c"], result.stdout
  assert abs(float(shares["c"]) - 75) < 5, result.stdout
  assert "weight 25.0%" in result.stdout and "weight 75.0%" in result.stdout
