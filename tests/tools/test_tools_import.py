"""Every tool imports next to the command-line entry points.

CI once failed on an xdist worker that had imported tools/bench_finetune.py
(for its batching helper) before a test imported bert_jax.cli: both defined
absl's --config at import time ("DuplicateFlagError: The flag 'config' is
defined twice"). Whether it failed depended on which tests shared a worker.
This test imports everything in one fresh process, so the clash shows every
time; tools define their flags in define_flags(), called when run as scripts.
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
  assert "bench_finetune" in tools  # The one that clashed.
  code = ("import sys; from tests.helpers import import_tool\n"
          "import bert_jax.cli, bert_jax.main, bert_jax.finetune\n"
          f"for name in {tools!r}: import_tool(name)\n"
          "import bert_jax.fill_mask, bert_jax.embed, bert_jax.export, bert_jax.zero_shot\n")
  result = subprocess.run([sys.executable, "-c", code], cwd=helpers.REPO,
                          capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
