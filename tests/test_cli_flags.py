"""bert_jax/cli.py's flag library: one definition per shared flag, and a
fresh FlagValues per call for commands called in process."""

import os

import pytest
from absl import flags

from bert_jax import cli
from tests.helpers import REPO


def _command(flag_values, argv=None):
  cli.define_config("Config.", flag_values=flag_values, argv=argv,
                    required=False)
  cli.define_model("Model.", flag_values=flag_values)
  cli.define_step(flag_values=flag_values)
  cli.define_output("Output.", flag_values=flag_values, required=False,
                    aliases=("out",))
  flags.DEFINE_bool("json", False, "Print JSON.", flag_values=flag_values)


def _other_command(flag_values, argv=None):
  del argv
  cli.define_model("Model.", flag_values=flag_values)
  flags.DEFINE_string("json", "", "A JSON file.", flag_values=flag_values)


def test_each_call_parses_afresh():
  first, _ = cli.parse(["--model", "a", "--step", "3", "--json",
                        "--out", "o"], _command, "doc")
  second, _ = cli.parse(["--model", "b"], _command, "doc")
  assert (first.model, first.step, first.json, first.output) == (
      "a", 3, True, "o")
  assert (second.model, second.step, second.json, second.output) == (
      "b", None, False, None)
  # A flag another command spells the same with another type: no clash.
  other, _ = cli.parse(["--model", "c", "--json", "x.json"], _other_command,
                       "doc")
  assert other.json == "x.json"


def test_config_overrides_come_from_the_argv_given():
  config = os.path.join(REPO, "configs", "tiny.py")
  values, rest = cli.parse(["--model", "m", "--config", config,
                            "--config.train.num_steps=7", "some text"],
                           _command, "doc", positional=True)
  assert values.config.train.num_steps == 7 and rest == ["some text"]


@pytest.mark.parametrize("argv,message", [
    (["--step", "2"], "error: flag --model=None: Flag --model must have a "
     "value other than None. Run with --help for the flags."),
    (["--model", "m", "--step", "x"], "error: flag --step=x: invalid literal"),
    (["--model", "m", "stray"], "error: unexpected argument 'stray': this "
     "command takes flags only."),
    (["--model", "m", "--config", os.path.join(REPO, "configs", "tiny.py"),
      "--config.train.nsteps=3"], "error: --config.train.nsteps: the config "
     "has no field 'nsteps'; did you mean 'num_steps'?"),
])
def test_a_wrong_command_line_is_one_line_and_exit_1(capsys, argv, message):
  with pytest.raises(SystemExit) as e:
    cli.parse(argv, _command, "doc")
  assert e.value.code == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(message), err


def test_help_lists_the_flags(capsys):
  with pytest.raises(SystemExit) as e:
    cli.parse(["--help"], _command, "The command's doc.")
  assert e.value.code == 0
  out = capsys.readouterr().out
  assert out.startswith("The command's doc.")
  for name in ("--model", "--step", "--output", "--out", "--json"):
    assert f"  {name}:" in out
