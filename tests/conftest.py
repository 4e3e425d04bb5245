"""Shared test setup: CPU only, quiet TF, one XLA compilation cache.

The helpers live in the tests/helpers package (child processes import them
too).
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One persistent XLA compilation cache for the whole suite (this process and
# every `python -m bert_jax.main` child): identical programs compile once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    __import__("tempfile").gettempdir(), "bert_jax_test_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_configure(config):
  """The tiers: `-m "not slow"` leaves out subprocess, multi-device and
  many-step tests."""
  config.addinivalue_line("markers", "slow: subprocess, multi-device or "
                          "many-step test (left out by -m 'not slow')")
