"""data/sources.py on small files: `data.sources` strings, the files a glob
names, and the refusals of input that holds no text, each one sentence
naming the field. (Runs that stop on such input are in the slow tier.)"""

import pytest

from bert_jax.data import sources


def test_source_string_kinds_weights_and_splits():
  parsed = sources.parse_sources(
      "corpus/*.txt@0.7; jsonl:web/*.jsonl ;tfds:wikipedia/20230601.en@2;"
      "tfds:c4:validation")
  assert [(s.kind, s.spec, s.split, s.weight) for s in parsed] == [
      ("text", "corpus/*.txt", "", 0.7), ("jsonl", "web/*.jsonl", "", 1.0),
      ("tfds", "wikipedia/20230601.en", "train", 2.0),
      ("tfds", "c4", "validation", 1.0)]
  assert str(parsed[2]) == "tfds:wikipedia/20230601.en:train@2"


@pytest.mark.parametrize("spec, message", [
    ("a.txt@0", "data.sources: weight must be > 0 in 'a.txt'."),
    ("a.txt@1e", "data.sources: bad weight in 'a.txt'."),
    ("tfds:", "data.sources: missing TFDS name in 'tfds:'."),
    ("text:", "data.sources: empty file pattern."),
])
def test_bad_source_strings_name_the_field(spec, message):
  with pytest.raises(ValueError) as e:
    sources.parse_sources(spec)
  assert str(e.value) == message


def test_globs_skip_empty_files_and_refuse_when_nothing_is_left(tmp_path,
                                                               caplog):
  (tmp_path / "a.txt").write_text("One sentence.\n")
  (tmp_path / "b.txt").write_text("")
  (tmp_path / "sub.txt").mkdir()  # A directory the glob matches: not a file.
  both = sources.Source(sources.TEXT, f"{tmp_path}/*.txt, {tmp_path}/a.txt")
  with caplog.at_level("WARNING"):
    files, empty = sources.resolve_text_files(both)
  assert files == [str(tmp_path / "a.txt")]
  assert empty == [str(tmp_path / "b.txt")]
  assert "Skipping 1 empty file(s)" in caplog.text
  with pytest.raises(ValueError) as e:
    sources.resolve_text_files(sources.Source(sources.TEXT,
                                              f"{tmp_path}/b*.txt"))
  assert str(e.value) == (f"data.sources: every file matching "
                          f"'{tmp_path}/b*.txt' is empty (1 file(s)).")
  with pytest.raises(ValueError, match="data.eval_sources: no file matches "):
    sources.resolve_text_files(
        sources.Source(sources.TEXT, f"{tmp_path}/none*.txt"),
        "data.eval_sources")


def test_lines_are_cut_repaired_and_blank_ones_skipped(tmp_path):
  path = tmp_path / "a.txt"
  path.write_bytes(b"first line\n\n  \nsecond \xff line\n" + b"x" * 50 + b"\n")
  text = sources.Source(sources.TEXT, str(path))
  assert list(sources.python_lines(text, max_line_bytes=20)) == [
      "first line", "second \ufffd line", "x" * 20]
  assert list(sources.python_lines(text, limit=1)) == ["first line"]


def test_a_binary_file_is_refused_naming_it(tmp_path):
  text = tmp_path / "notes.txt"
  text.write_text("A sentence of words.\n" * 10)
  sources.check_usable(sources.Source(sources.TEXT, str(text)))
  binary = tmp_path / "model.bin"
  binary.write_bytes(bytes(range(256)) * 40)
  with pytest.raises(ValueError, match=str(binary)):
    sources.check_usable(sources.Source(sources.TEXT, str(binary)))
  symbols = tmp_path / "symbols.txt"
  symbols.write_bytes(b"\xff\xfe %\n" * 300)
  with pytest.raises(ValueError) as e:
    sources.check_usable(sources.Source(sources.TEXT, str(symbols)))
  assert str(e.value) == (
      f"data.sources: text:{symbols}@1 yields no usable sentences: 0 of the "
      f"first 256 lines of {symbols} are UTF-8 text (the rest invalid UTF-8, "
      "e.g. a binary file); point it at UTF-8 text files with one sentence "
      "per line.")
