"""Shared test setup: CPU only, quiet TF, one XLA compilation cache.

The helpers live in the tests/helpers package (child processes import them
too).
"""

import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One persistent XLA compilation cache for the whole suite (this process and
# every `python -m bert_jax.main` child): identical programs compile once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    __import__("tempfile").gettempdir(), "bert_jax_test_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# Tiny models compile far longer than they run: XLA's expensive passes off
# (jax_disable_most_optimizations) here and in every child. A test that
# runs many steps of a real-size model (unfused, they take 2x as long), or
# holds two programs to the optimized programs' tolerance, turns them on
# (the `optimized` fixture).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")


def pytest_configure(config):
  """The tiers: `-m "not slow"` leaves out subprocess, multi-device and
  many-step tests."""
  config.addinivalue_line("markers", "slow: subprocess, multi-device or "
                          "many-step test (left out by -m 'not slow')")


@pytest.fixture
def optimized():
  """XLA's full optimizations for this test: many steps of a real-size
  model, or two programs' numbers compared at a tolerance the optimized
  programs are held to."""
  import jax  # pylint: disable=g-import-not-at-top
  disabled = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", False)
  yield
  jax.config.update("jax_disable_most_optimizations", disabled)


@pytest.fixture(scope="session", autouse=True)
def temp_files_under_basetemp(tmp_path_factory):
  """The temporary files the suite does not name itself -- TFDS's metadata
  directories (`tmp*tfds`, one per unprepared builder, never removed), the
  details file of each failed bert_jax command, those of the children --
  go under pytest's base temp (which keeps the last three runs), not the
  machine's temp directory."""
  import tempfile  # pylint: disable=g-import-not-at-top
  path = str(tmp_path_factory.mktemp("tmp"))
  saved = os.environ.get("TMPDIR"), tempfile.tempdir
  os.environ["TMPDIR"] = path
  tempfile.tempdir = path
  yield
  if saved[0] is None:
    del os.environ["TMPDIR"]
  else:
    os.environ["TMPDIR"] = saved[0]
  tempfile.tempdir = saved[1]
