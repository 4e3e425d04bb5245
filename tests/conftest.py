"""Shared test setup: CPU only, quiet TF, and a tiny trainable config."""

import os
import subprocess
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# One persistent XLA compilation cache for the whole suite (this process and
# every `python -m bert_jax.main` child): identical programs compile once.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    __import__("tempfile").gettempdir(), "bert_jax_test_xla_cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Flags that shrink configs/tiny.py to a seconds-scale run on 2 CPU cores.
TINY_OVERRIDES = (
    "--config.model.vocab_size=512",
    "--config.model.hidden_size=64",
    "--config.model.num_attention_heads=4",
    "--config.model.intermediate_size=256",
    "--config.model.max_position_embeddings=64",
    "--config.data.tokenizer_vocab_size=512",
    "--config.data.seq_length=32",
    "--config.data.max_predictions_per_seq=5",
    "--config.data.num_eval_batches=2",
    "--config.train.batch_size=16",
    "--config.train.learning_rate=2e-3",
    "--config.train.warmup_steps=5",
    # A fixed MFU peak skips the startup matmul probe (seconds per run).
    "--config.train.peak_tflops=1.0",
)


def tiny_config():
  """configs/tiny.py with TINY_OVERRIDES applied, as a ConfigDict."""
  sys.path.insert(0, REPO)
  from configs import tiny  # pylint: disable=g-import-not-at-top
  config = tiny.get_config()
  for flag in TINY_OVERRIDES:
    key, value = flag[len("--config."):].split("=")
    group, field = key.split(".")
    config[group][field] = type(config[group][field])(value)
  return config


def child_env(**extra) -> dict:
  """Environment for a `python` child: this repo importable, CPU only, quiet
  TF, no hub downloads; `extra` on top."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
             HF_HUB_OFFLINE="1",
             PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.update(extra)
  return env


def run_main(workdir, *flags, env=None, timeout=600):
  """Run `python -m bert_jax.main` with the tiny config; returns the result."""
  cmd = [sys.executable, "-m", "bert_jax.main", "--config",
         os.path.join(REPO, "configs", "tiny.py"), "--workdir", str(workdir),
         *TINY_OVERRIDES, *flags]
  return subprocess.run(cmd, cwd=REPO, env=child_env(**(env or {})),
                        capture_output=True, text=True, timeout=timeout)


def run_tool(script, *args, timeout=600):
  """Run `python tools/<script> *args` from the repo root; returns the result."""
  return subprocess.run(
      [sys.executable, os.path.join(REPO, "tools", script), *args], cwd=REPO,
      env=child_env(), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def tiny():
  return tiny_config()
