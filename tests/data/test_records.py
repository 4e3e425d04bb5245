"""JSONL and Parquet corpora as pretraining sources.

Corpora generated here: synthetic documents whose sentences end with a
period and start with a capital, written as a text file (one sentence per
line), as JSONL (each document's sentences joined into one paragraph, with
other fields beside the text) and as Parquet (two row groups). The record
sources are split into the text file's sentences, give the same batches,
resume exactly (data iterator and a real run), and bad records are one line
with nothing written.
"""

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from bert_jax import config_lib
from bert_jax.data import demo_corpus
from bert_jax.data import features
from bert_jax.data import pipeline
from bert_jax.data import records
from bert_jax.data import sources as data_sources
from bert_jax.data import tokenizers
from tests import helpers
from tests.helpers import in_process


def write_jsonl(path, docs, field="text", join=" "):
  with open(path, "w") as f:
    for i, doc in enumerate(docs):
      f.write(json.dumps({"id": i, field: join.join(doc), "url": f"u/{i}"})
              + "\n")


def write_parquet(path, docs, field="text", join=" "):
  table = pa.table({"id": list(range(len(docs))),
                    field: [join.join(d) for d in docs]})
  pq.write_table(table, path, row_group_size=max(1, len(docs) // 2))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The same documents as text, JSONL and Parquet, and a WordPiece vocab."""
  d = tmp_path_factory.mktemp("records")
  docs = demo_corpus.synthetic_documents(300, seed=4)
  for kind in ("text", "jsonl", "parquet"):
    os.makedirs(d / kind)
  demo_corpus.write_documents(str(d / "text" / "corpus.txt"), docs)
  write_jsonl(d / "jsonl" / "corpus.jsonl", docs)
  write_parquet(d / "parquet" / "corpus.parquet", docs)
  words = sorted({w.strip(".").lower() for doc in docs for s in doc
                  for w in s.split()})
  vocab = list(tokenizers.SPECIAL_TOKENS) + words + ["."]
  vocab_path = str(d / "vocab.txt")
  tokenizers.save_wordpiece(vocab, vocab_path)
  tok = tokenizers.load(vocab_path, tokenizers.WORDPIECE, lower_case=True)
  return dict(dir=d, docs=docs, tok=tok, vocab=vocab_path)


def _config(sources, **data):
  c = config_lib.get_config("tiny")
  c.model.vocab_size = 4096
  c.data.update(sources=sources, tokenizer_type="wordpiece", seq_length=32,
                max_predictions_per_seq=5, shuffle_buffer=64, block_lines=128,
                eval_fraction=0.0, num_eval_batches=1, **data)
  c.train.update(batch_size=8, seed=5)
  return c


def test_record_text_is_split_as_tfds_documents_are():
  """One rule for a record's text (here, in Python) and a TFDS document's
  (in the pipeline's graph): newlines and sentence ends."""
  texts = ["First one. Second one! (Third) here?  \"Fourth\" ends.\n\nNext "
           "para.\r\nLine two.\tTab. 3 starts",
           "no break e.g. here. lower case stays. And Mr. Smith.",
           "  \n  ", "Ünïcode. Ça va? Oui.\u00a0Non"]
  for text in texts:
    graph = [s.decode() for s in data_sources.document_to_lines(
        tf.constant(text)).numpy()]
    assert records.split_document(text) == graph[:-1] and graph[-1] == ""
  assert records.split_document(texts[0]) == [
      "First one.", "Second one!", "(Third) here?", "\"Fourth\" ends.",
      "Next para.", "Line two.", "Tab.", "3 starts"]


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_records_become_the_text_files_sentences(corpus, kind, tmp_path):
  """Each document's paragraph is split back into its sentences; the
  prepared file is the text file, byte for byte, and keeps its name."""
  source = data_sources.Source(kind, str(corpus["dir"] / kind / "*"))
  prepared = data_sources.prepared(source, _config("").data, str(tmp_path))
  (path,) = tf.io.gfile.glob(prepared.spec)
  assert os.path.basename(path) == "corpus.txt"
  with open(path) as f, open(corpus["dir"] / "text" / "corpus.txt") as g:
    assert f.read() == g.read()
  assert str(prepared) == (f"{kind}:{source.spec}@1 (text field 'text')")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_same_text_as_text_file_and_as_records_gives_same_batches(
    corpus, kind, tmp_path):
  tok = corpus["tok"]
  text = _config(f"text:{corpus['dir'] / 'text' / '*.txt'}")
  recs = _config(f"{kind}:{corpus['dir'] / kind / '*'}")
  want = pipeline.make_dataset(text, tok, data_sources.plan(text.data, None),
                         keep_stats=False).take(12)
  got = pipeline.make_dataset(recs, tok, data_sources.plan(recs.data,
                                                     str(tmp_path)),
                        keep_stats=False).take(12)
  n = 0
  for w, g in zip(want, got):
    for k in features.PRETRAINING_NAMES:
      np.testing.assert_array_equal(w[k].numpy(), g[k].numpy(), err_msg=k)
    n += 1
  assert n == 12


@pytest.mark.slow
def test_jsonl_and_parquet_mixed_resume_exactly(corpus, tmp_path):
  """The data position of a record source is saved and restored exactly
  (it is a text source once prepared), mixed by weight with shuffling."""
  tok = corpus["tok"]
  c = _config(f"jsonl:{corpus['dir'] / 'jsonl' / '*'}@0.6;"
              f"parquet:{corpus['dir'] / 'parquet' / '*'}@0.4")
  helpers.assert_train_iterator_resumes_exactly(c, tok, tmp_path,
                                                saved_after=5, compared=6)


def _records_in(workdir) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  return [r for r in rows if r["split"] == "train"]


@pytest.mark.slow
def test_pretraining_on_parquet_and_jsonl_resumes_exactly(corpus, tmp_path):
  """`python -m bert_jax.main` on a Parquet corpus (a JSONL one for eval):
  6 steps straight; then the step-6 checkpoint is dropped and the same
  command resumes from step 4 without preparing anything again, and its
  steps 5 and 6 have the straight run's losses."""
  workdir = tmp_path / "run"
  flags = (f"--config.data.sources=parquet:{corpus['dir'] / 'parquet' / '*'}",
           f"--config.data.eval_sources=jsonl:"
           f"{corpus['dir'] / 'jsonl' / '*'}",
           "--config.train.num_steps=6", "--config.train.log_every=1",
           "--config.checkpoint.save_every_steps=2",
           "--config.checkpoint.async_save=False")
  first = in_process.run_main(workdir, *flags)
  assert first.returncode == 0, first.stderr[-3000:]
  assert first.stderr.count("Prepared ") == 2, first.stderr[-3000:]
  straight = {r["step"]: r["loss"] for r in _records_in(workdir)}
  import shutil
  shutil.rmtree(workdir / "checkpoints" / "6")
  second = in_process.run_main(workdir, *flags)
  assert second.returncode == 0, second.stderr[-3000:]
  assert "Resumed from checkpoint step 4" in second.stderr
  assert "Prepared " not in second.stderr  # The files it trained on.
  resumed = _records_in(workdir)[6:]
  assert [r["step"] for r in resumed] == [5, 6]
  for r in resumed:
    assert r["loss"] == straight[r["step"]], (r, straight)


def _bad_case(name, d):
  docs = [["A first sentence.", "A second one."], ["Another document."]]
  if name == "jsonl_bad_line":
    write_jsonl(d / "c.jsonl", docs)
    with open(d / "c.jsonl", "a") as f:
      f.write('{"text": "cut off\n')
    return "jsonl", (f"data.sources: jsonl:{d}/*.jsonl@1 (text field "
                     f"'text'): {d}/c.jsonl line 3 is not a JSON object "
                     "(")
  if name == "jsonl_missing_field":
    write_jsonl(d / "c.jsonl", docs, field="content")
    return "jsonl", (f"{d}/c.jsonl line 1 has no field 'text' (it has 'id', "
                     "'content', 'url'); set data.text_field to the field")
  if name == "jsonl_not_a_string":
    with open(d / "c.jsonl", "w") as f:
      f.write('{"text": "Fine."}\n{"text": ["a", "list"]}\n')
    return "jsonl", (f"{d}/c.jsonl line 2: field 'text' is a list, not a "
                     "string")
  if name == "parquet_missing_column":
    write_parquet(d / "c.parquet", docs, field="content")
    return "parquet", (f"{d}/c.parquet has no column 'text' (columns: 'id', "
                       "'content'); set data.text_field")
  if name == "not_parquet":
    (d / "c.parquet").write_text("id,text\n1,hello\n")
    return "parquet", f"{d}/c.parquet is not a readable Parquet file"
  raise AssertionError(name)


@pytest.mark.parametrize("name", ["jsonl_bad_line", "jsonl_missing_field",
                                  "jsonl_not_a_string",
                                  "parquet_missing_column", "not_parquet"])
def test_bad_record_is_one_line_and_nothing_is_written(tmp_path, name):
  d = tmp_path / "in"
  d.mkdir()
  kind, expect = _bad_case(name, d)
  ext = "jsonl" if kind == "jsonl" else "parquet"
  workdir = tmp_path / "run"
  workdir.mkdir()  # As the run's lock leaves it.
  c = _config(f"{kind}:{d}/*.{ext}")
  with pytest.raises(ValueError) as e:
    data_sources.plan(c.data, str(workdir))
  message = str(e.value)
  assert expect in message, message
  assert len(message.splitlines()) == 1
  assert os.listdir(workdir) == []  # No prepared/ directory, nothing in it.


def test_bad_record_on_the_command_line(tmp_path):
  """A missing column is found by the startup checks: one line, exit 1,
  before the workdir is taken."""
  d = tmp_path / "in"
  d.mkdir()
  write_parquet(d / "c.parquet", [["A sentence."]], field="content")
  workdir = tmp_path / "run"
  result = in_process.run_main(workdir,
                               f"--config.data.sources=parquet:{d}/*")
  (line,) = helpers.failure_lines(result, max_lines=2)[-1:]
  assert line.startswith(f"error: data.sources: parquet:{d}/*@1 (text field "
                         f"'text'): {d}/c.parquet has no column 'text'"), line
  assert not workdir.exists()


def test_bad_record_after_the_first_line_leaves_nothing(tmp_path):
  """A raw tab inside a JSON string on line 3 (line 1 passes the startup
  check): the run names the file, line and column, and leaves neither a
  tokenizer record nor a lock nor the directories it made for the
  workdir."""
  from bert_jax.training import trainer as trainer_lib
  from tests.helpers import tiny_models
  d = tmp_path / "in"
  d.mkdir()
  write_jsonl(d / "c.jsonl", [["A first sentence.", "A second one."],
                              ["Another document."]])
  with open(d / "c.jsonl", "a") as f:
    f.write('{"text": "a raw\ttab"}\n')
  vocab = tmp_path / "vocab.txt"
  tiny_models.write_vocab(str(vocab))
  config = helpers.tiny_config(model=dict(vocab_size=128))
  config.data.update(sources=f"jsonl:{d}/*.jsonl", tokenizer_type="wordpiece",
                     tokenizer_path=str(vocab))
  workdir = tmp_path / "new" / "run"
  with pytest.raises(ValueError) as e:
    trainer_lib.train_and_evaluate(config, str(workdir))
  assert str(e.value) == (
      f"data.sources: jsonl:{d}/*.jsonl@1 (text field 'text'): {d}/c.jsonl "
      "line 3 is not a JSON object (Invalid control character at column "
      "16): a JSONL file holds one JSON object per line.")
  assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_prepare_tool_converts_in_parallel_once(corpus, tmp_path):
  """tools/prepare_corpus.py: 3 files in 2 worker processes give the files a
  run prepares by itself; a rerun converts nothing; a changed file is
  converted again, a removed one dropped."""
  d = tmp_path / "in"
  d.mkdir()
  docs = corpus["docs"]
  for k in range(3):
    write_jsonl(d / f"part-{k}.jsonl", docs[k::3])
  out = tmp_path / "prepared"
  args = ("prepare_corpus.py", "--sources", f"jsonl:{d}/*.jsonl",
          "--output_dir", str(out))
  first = helpers.run_tool(*args, "--workers", "2")
  assert first.returncode == 0, first.stderr[-3000:]
  assert "3 of 3 file(s) converted" in first.stdout, first.stdout
  (glob,) = [ln.split("; text files ")[1] for ln in first.stdout.splitlines()
             if "; text files " in ln]
  files = sorted(tf.io.gfile.glob(glob))
  assert [os.path.basename(f) for f in files] == [
      "part-0.txt", "part-1.txt", "part-2.txt"]
  for k, f in enumerate(files):
    want = tmp_path / f"want{k}.txt"
    demo_corpus.write_documents(str(want), docs[k::3])
    assert open(f).read() == want.read_text()
  # A run with data.prepared_dir=OUT finds them prepared.
  c = _config(f"jsonl:{d}/*.jsonl", prepared_dir=str(out))
  assert data_sources.plan(c.data, None).train[0].spec == glob
  again = helpers.run_tool(*args)
  assert again.returncode == 0 and "0 of 3 file(s) converted" in again.stdout
  write_jsonl(d / "part-1.jsonl", docs[:5])
  os.remove(d / "part-2.jsonl")
  third = helpers.run_tool(*args)
  assert "1 of 2 file(s) converted" in third.stdout, third.stdout
  assert [os.path.basename(f) for f in sorted(tf.io.gfile.glob(glob))] == [
      "part-0.txt", "part-1.txt"]


@pytest.mark.slow
def test_other_processes_wait_for_process_0(corpus, tmp_path):
  """Multi-host: process 0 prepares; process 1 (here a thread) waits for its
  marker and gets the same files, converting nothing itself."""
  import threading

  from bert_jax.data import prepared_text
  path = str(corpus["dir"] / "jsonl" / "corpus.jsonl")
  out = {}

  def other():
    out["p1"] = prepared_text.prepare("jsonl", path, [path], "text",
                                      str(tmp_path), process_index=1)

  thread = threading.Thread(target=other)
  thread.start()
  thread.join(timeout=3)
  assert thread.is_alive()  # Waiting: nothing is prepared yet.
  assert not list(tmp_path.iterdir())
  p0 = prepared_text.prepare("jsonl", path, [path], "text", str(tmp_path),
                             process_index=0)
  thread.join(timeout=30)
  assert not thread.is_alive()
  assert out["p1"].glob == p0.glob and out["p1"].converted == 0
  assert p0.converted == 1 and len(tf.io.gfile.glob(p0.glob)) == 1
