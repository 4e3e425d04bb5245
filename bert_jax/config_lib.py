"""Default config groups shared by every file under configs/.

A config is a ``ConfigDict`` with five groups: ``model`` (field names as in
Hugging Face ``BertConfig``), ``data``, ``train``, ``mesh`` and ``checkpoint``.
Files in ``configs/`` call :func:`get_config` with a model size and override
what they need; users override anything on the command line
(``--config.train.num_steps=10``).
"""

import ml_collections

# name -> (num_hidden_layers, hidden_size). Turc et al. 2019 / Devlin et al. 2019.
MODEL_SIZES = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


def model_config(size: str = "base") -> ml_collections.ConfigDict:
  """BertConfig-compatible hyperparameters; head size 64 and FFN 4x hidden."""
  layers, hidden = MODEL_SIZES[size]
  return ml_collections.ConfigDict(dict(
      vocab_size=30522,
      hidden_size=hidden,
      num_hidden_layers=layers,
      num_attention_heads=hidden // 64,
      intermediate_size=4 * hidden,
      hidden_act="gelu",
      hidden_dropout_prob=0.1,
      attention_probs_dropout_prob=0.1,
      max_position_embeddings=512,
      type_vocab_size=2,
      initializer_range=0.02,
      layer_norm_eps=1e-12,
      # Compute dtype of activations and matmul inputs; params stay float32.
      dtype="float32",
  ))


def data_config() -> ml_collections.ConfigDict:
  """Input pipeline options. With no sources set, the embedded demo corpus is used."""
  return ml_collections.ConfigDict(dict(
      # Text-file globs in google-research/bert layout (one sentence per
      # line, blank line between documents). Empty: the demo corpus
      # (CPython's bundled documentation topics), written into the workdir.
      train_files="",
      eval_files="",  # Empty: hold out `eval_fraction` of the documents.
      eval_fraction=0.05,
      # Tokenizer: "sentencepiece" (a .model file) or "wordpiece" (vocab.txt).
      tokenizer_type="sentencepiece",
      tokenizer_path="",  # Empty: train one on the corpus, cached in workdir.
      lower_case=True,
      seq_length=128,
      max_predictions_per_seq=20,
      mask_rate=0.15,
      nsp=True,
      short_seq_prob=0.1,
      shuffle_buffer=10_000,
      num_eval_batches=8,
  ))


def train_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      num_steps=1000,
      batch_size=32,  # Global, across all hosts and devices.
      learning_rate=1e-4,
      warmup_steps=100,
      weight_decay=0.01,
      adam_b1=0.9,
      adam_b2=0.999,
      adam_eps=1e-6,
      max_grad_norm=1.0,
      optimizer="adamw",  # or "lamb"
      grad_accum_steps=1,
      log_every=10,
      eval_every=100,
      seed=0,
  ))


def mesh_config() -> ml_collections.ConfigDict:
  """Device mesh; -1 on one axis takes all remaining devices."""
  return ml_collections.ConfigDict(dict(
      data=-1,
      fsdp=1,
      tensor=1,
      # Logical axis name -> mesh axis (or None: replicated). One table for
      # parameters and activations; changing parallelism is a config change.
      rules=[
          ("activation_batch", ("data", "fsdp")),
          ("activation_length", None),
          ("activation_embed", None),
          ("activation_mlp", "tensor"),
          ("activation_heads", "tensor"),
          ("activation_vocab", "tensor"),
          ("embed", "fsdp"),
          ("mlp", "tensor"),
          ("heads", "tensor"),
          ("kv", None),
          ("vocab", "tensor"),
          ("norm", None),
          ("position", None),
          ("type", None),
          ("classes", None),
      ],
  ))


def checkpoint_config() -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(dict(
      save_every_steps=500,
      max_to_keep=3,
      async_save=True,
  ))


def get_config(size: str = "base") -> ml_collections.ConfigDict:
  config = ml_collections.ConfigDict()
  config.model = model_config(size)
  config.data = data_config()
  config.train = train_config()
  config.mesh = mesh_config()
  config.checkpoint = checkpoint_config()
  return config
