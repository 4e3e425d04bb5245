"""Wrong input is refused before anything is written, naming the real cause.

A program file given as a text corpus is named as binary before a tokenizer
is trained on it (not a later "The eval data ... produced no examples"); a
0-byte tokenizer file is named as empty (not as lacking special tokens);
ELECTRA's generator size, a missing DistilBERT teacher and sentence pairs
for families with no pair head are refused before the demo corpus or a
tokenizer is written. Each case runs the pretraining job in process
(`train_and_evaluate`, what `python -m bert_jax.main` calls) on a fresh
workdir; one also through the command line (one line, exit 1).
"""


import numpy as np
import pytest

from bert_jax.training import trainer as trainer_lib
from tests import helpers
from tests.helpers import in_process


def elf_like(seed: int = 0, size: int = 200_000) -> bytes:
  """A compiled program's bytes (what /usr/bin/ls holds): headers and machine
  code (random bytes, runs of NULs) between string tables of symbol names,
  so that many of its "lines" decode as UTF-8 and hold words."""
  r = np.random.default_rng(seed)
  names = [b"memcpy", b"GLIBC_2.14", b"__libc_start_main", b"strlen",
           b"getenv", b"setlocale", b"program_name", b"quoting_style"]
  out = bytearray(b"\x7fELF\x02\x01\x01" + bytes(57))
  while len(out) < size:
    if r.random() < 0.5:
      out += bytes(r.integers(0, 256, r.integers(16, 200), dtype=np.uint8))
      out += bytes(int(r.integers(0, 32)))
    else:
      out += b"\x00".join(names[i] for i in r.integers(0, len(names), 8))
      out += b"\x00\n"
  return bytes(out)


def _case(name, tmp_path):
  """(config, the start of the one-line error) for a refusal case."""
  electra = dict(name="electra")
  distil = dict(name="distil", teacher="random", student_layers=1)
  packed = dict(nsp=False)
  if name == "program_as_corpus":
    path = tmp_path / "ls"
    path.write_bytes(elf_like())
    return (helpers.tiny_config(data=dict(train_files=str(path))),
            f"data.train_files: text:{path}@1 yields no usable sentences: "
            f"{path} is a binary file (NUL bytes in line 1), not UTF-8 text")
  if name == "empty_tokenizer_model":
    path = tmp_path / "spm.model"
    path.write_bytes(b"")
    return (helpers.tiny_config(data=dict(tokenizer_path=str(path))),
            f"{path} is empty (0 bytes): not a SentencePiece model")
  if name.startswith("electra_generator_"):
    size = float(name.rsplit("_", 1)[1])
    return (helpers.tiny_config(
        objective=dict(electra, generator_hidden_size=size), data=packed),
            f"objective.generator_hidden_size={size} must be a fraction of "
            "model.hidden_size in (0, 1]")
  if name == "distil_missing_teacher":
    teacher = str(tmp_path / "no_such_teacher")
    return (helpers.tiny_config(objective=dict(distil, teacher=teacher),
                                data=packed),
            f"objective.teacher: {teacher!r} does not exist")
  if name == "electra_nsp":
    return (helpers.tiny_config(objective=electra, data=dict(nsp=True)),
            "data.nsp=True: ELECTRA trains no sentence-pair head, so NSP "
            "pairs (half of them with a random second segment) would only "
            "corrupt its input; set data.nsp=False")
  if name == "distil_sop":
    return (helpers.tiny_config(objective=distil, data=dict(objective="sop")),
            "data.objective='sop': DistilBERT trains no sentence-pair head, "
            "so SOP pairs (half of them with a swapped second segment)")
  raise AssertionError(name)


CASES = ("program_as_corpus", "empty_tokenizer_model", "electra_generator_0",
         "electra_generator_3.0", "distil_missing_teacher", "electra_nsp",
         "distil_sop")


@pytest.mark.parametrize("name", CASES)
def test_refused_before_anything_is_written(tmp_path, name):
  config, expect = _case(name, tmp_path)
  workdir = tmp_path / "new" / "run"
  with pytest.raises(ValueError) as e:
    trainer_lib.train_and_evaluate(config, str(workdir))
  message = str(e.value)
  assert message.startswith(expect), message
  assert len(message.splitlines()) == 1, message
  # No demo corpus, no tokenizer, no checkpoint, no lock, no directory.
  assert not (tmp_path / "new").exists()


def test_refusal_on_the_command_line_is_one_line_and_exit_1(tmp_path):
  workdir = tmp_path / "run"
  result = in_process.run_main(
      workdir, "--config.objective.name=electra",
      "--config.objective.generator_hidden_size=3.0",
      "--config.data.nsp=False")
  (line,) = helpers.failure_lines(result, max_lines=2)[-1:]
  assert line.startswith("error: objective.generator_hidden_size=3.0 must "
                         "be a fraction of model.hidden_size in (0, 1]"), line
  assert not workdir.exists()
