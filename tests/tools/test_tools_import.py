"""Every tool imports next to the command-line entry points.

A command defines its absl flags when it runs (`define_flags`, on absl's
FLAGS under `cli.run` or on a fresh FlagValues under `cli.parse`), never at
import, except the jobs' shared flags (`cli.define_job_flags`, defined
once): two modules defining --config at import could not be imported
together ("DuplicateFlagError: The flag 'config' is defined twice"), and
tests import tools for their helpers in whatever worker runs them. This
test imports everything in one fresh process, so such a clash shows every
time.
"""

import glob
import os
import subprocess
import sys

import pytest

from tests import helpers

pytestmark = pytest.mark.slow


def test_every_tool_imports_next_to_the_entry_points():
  tools = sorted(os.path.basename(p)[:-3]
                 for p in glob.glob(os.path.join(helpers.REPO, "tools", "*.py")))
  assert "bench_finetune" in tools  # Tests import it for its helpers.
  code = ("import sys; from tests.helpers import import_tool\n"
          "import bert_jax.cli, bert_jax.main, bert_jax.finetune\n"
          f"for name in {tools!r}: import_tool(name)\n"
          "import bert_jax.fill_mask, bert_jax.embed, bert_jax.export, "
          "bert_jax.zero_shot, bert_jax.to_hf, bert_jax.from_hf\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=helpers.REPO,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
