"""Every check of a config, in one pass, before anything is written.

`validate` runs at startup (the trainer, tools) before the workdir, demo
corpus or tokenizer is created, so a wrong value costs seconds, not a
tokenizer trained on millions of lines. It raises ValueError (or
FileNotFoundError for a missing source) with one sentence naming the field,
its value and what to do. `check_tokenizer` is the one check that needs the
loaded tokenizer (its size and special tokens).
"""

from __future__ import annotations

import ml_collections

from bert_jax import config_lib
from bert_jax import objectives
from bert_jax.models import bert as model_lib
from bert_jax.models import splash
from bert_jax.training import optim
from bert_jax.training import phases as phases_lib
from bert_jax.training import preemption
from bert_jax.training import sharding

MAX_SEQ_LENGTH = 4096  # The input pipeline's block and position limits.


def validate(config: ml_collections.ConfigDict, num_devices: int,
             process_count: int = 1, *, check_sources: bool = True) -> None:
  """All static checks: objective, model, data, train and mesh."""
  objectives.get(config.objective.name)
  model_lib.validate_model_config(config.model)
  _check_objective(config)
  _check_data(config)
  _check_train_and_mesh(config, num_devices, process_count)
  _check_phases(config, num_devices, process_count)
  if check_sources:
    _check_sources(config.data)


def check_tokenizer(config: ml_collections.ConfigDict, tok) -> None:
  """The tokenizer fits the model and has BERT's special tokens."""
  if tok.vocab_size > config.model.vocab_size:
    raise ValueError(
        f"Tokenizer vocabulary size {tok.vocab_size} ({tok.path}) exceeds "
        f"model.vocab_size={config.model.vocab_size}; set model.vocab_size >= "
        f"{tok.vocab_size}.")
  missing = tok.missing_special_tokens
  if missing:
    raise ValueError(f"Tokenizer {tok.path} lacks the special token(s) "
                     f"{', '.join(missing)}.")


def _check_objective(config) -> None:
  """Family-specific fields: the objective's own checks (its `validate`)."""
  check = objectives.for_config(config).validate
  if check is not None:
    check(config)


def _check_data(config) -> None:
  data, model = config.data, config.model
  if data.tokenizer_type not in config_lib.TOKENIZER_TYPES:
    raise ValueError(f"data.tokenizer_type={data.tokenizer_type!r} must be "
                     "'sentencepiece' or 'wordpiece'.")
  if not data.tokenizer_path and data.tokenizer_vocab_size < 16:
    raise ValueError(f"data.tokenizer_vocab_size={data.tokenizer_vocab_size} "
                     "is too small (need >= 16).")
  if data.seq_length > model.max_position_embeddings:
    raise ValueError(
        f"data.seq_length={data.seq_length} exceeds "
        f"model.max_position_embeddings={model.max_position_embeddings}.")
  if data.seq_length > MAX_SEQ_LENGTH:
    raise ValueError(f"data.seq_length={data.seq_length} exceeds the "
                     f"pipeline's limit of {MAX_SEQ_LENGTH}.")
  if data.seq_length < 8:
    raise ValueError(f"data.seq_length={data.seq_length} is too short "
                     "(need >= 8).")
  if model.attention_impl == "splash":
    splash.check_seq_length(data.seq_length)
  if not 1 <= data.max_predictions_per_seq <= data.seq_length:
    raise ValueError(
        f"data.max_predictions_per_seq={data.max_predictions_per_seq} must be "
        f"in [1, data.seq_length={data.seq_length}].")
  if not 0.0 < data.mask_rate <= 1.0:
    raise ValueError(f"data.mask_rate={data.mask_rate} must be in (0, 1].")
  if not (0 <= data.mask_token_prob and 0 <= data.random_token_prob
          and data.mask_token_prob + data.random_token_prob <= 1.0):
    raise ValueError(
        f"data.mask_token_prob={data.mask_token_prob} and "
        f"data.random_token_prob={data.random_token_prob} must be >= 0 and "
        "sum to <= 1.")
  if not 1 <= data.max_ngram <= 16:
    raise ValueError(f"data.max_ngram={data.max_ngram} must be in [1, 16] "
                     "(1: no spans; ALBERT uses 3).")
  obj = config_lib.sentence_objective(data)
  if obj not in config_lib.SENTENCE_OBJECTIVES:
    raise ValueError(f"data.objective={data.objective!r} must be one of "
                     "'nsp', 'sop', 'packed' (or '').")
  if (obj == config_lib.PACKED) == bool(data.nsp):
    raise ValueError(f"data.objective={obj!r} conflicts with "
                     f"data.nsp={data.nsp}: 'nsp'/'sop' need nsp=True, "
                     "'packed' needs nsp=False.")
  if obj != config_lib.PACKED and model.type_vocab_size < 2:
    raise ValueError(f"data.objective={obj!r} needs model.type_vocab_size >= 2"
                     f", got {model.type_vocab_size}.")
  _check_packing(config)
  if data.block_lines < 2:
    raise ValueError(f"data.block_lines={data.block_lines} must be >= 2.")
  if not 0.0 <= data.eval_fraction < 1.0:
    raise ValueError(f"data.eval_fraction={data.eval_fraction} must be in "
                     "[0, 1).")


def _check_packing(config) -> None:
  data = config.data
  if not data.get("packing", False):
    return
  name = config.objective.name
  if not objectives.get(name).packing:
    readers = [n for n in objectives.names() if objectives.get(n).packing]
    raise ValueError(
        f"data.packing=True with objective.name={name!r}: packed rows are "
        f"read by {', '.join(readers)} only; set data.packing=False.")
  s, window = int(data.packing_max_sequences), int(data.packing_window)
  if not 1 <= s <= data.seq_length // 2:
    raise ValueError(
        f"data.packing_max_sequences={s} must be in [1, data.seq_length / 2 "
        f"= {data.seq_length // 2}] (each packed example holds at least "
        "[CLS] and [SEP]).")
  if window < 1:
    raise ValueError(f"data.packing_window={window} must be >= 1 (examples "
                     "bin-packed together; 1024 is a good start).")


def _check_train_and_mesh(config, num_devices: int, process_count: int):
  t = config.train
  if t.num_steps <= 0 or t.batch_size <= 0:
    raise ValueError(f"train.num_steps={t.num_steps} and train.batch_size="
                     f"{t.batch_size} must be positive.")
  if t.grad_accum_steps < 1:
    raise ValueError(f"train.grad_accum_steps={t.grad_accum_steps} must be "
                     ">= 1.")
  # Their modules own these decisions; building them is cheap and checks.
  optim.make_optimizer(t)
  preemption.NonFiniteMonitor(t.nonfinite_policy, t.max_nonfinite_in_a_row)
  for field in ("log_every", "eval_every"):
    if t[field] < 1:
      raise ValueError(f"train.{field}={t[field]} must be >= 1.")
  if config.checkpoint.save_every_steps < 1:
    raise ValueError(f"checkpoint.save_every_steps="
                     f"{config.checkpoint.save_every_steps} must be >= 1.")
  mesh_shape = dict(zip(sharding.MESH_AXES,
                        sharding.mesh_shape(config.mesh, num_devices)))
  dp = mesh_shape["data"] * mesh_shape["fsdp"]
  if t.batch_size % (dp * t.grad_accum_steps):
    raise ValueError(
        f"train.batch_size={t.batch_size} is not divisible by the "
        f"data-parallel size (mesh.data*mesh.fsdp={dp}) times "
        f"train.grad_accum_steps={t.grad_accum_steps}.")
  if t.batch_size % process_count:
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by the "
                     f"process count {process_count}.")
  heads, tp = config.model.num_attention_heads, mesh_shape["tensor"]
  if heads % tp:
    raise ValueError(f"model.num_attention_heads={heads} is not divisible by "
                     f"mesh.tensor={tp}.")


def _check_phases(config, num_devices: int, process_count: int) -> None:
  """Each phase of train.phases / train.recipe passes the shape checks."""
  phases = phases_lib.resolve(config)
  if not phases_lib.is_phased(config):
    return
  for phase in phases:
    pc = phases_lib.phase_config(config, phase)
    try:
      _check_data(pc)
      _check_train_and_mesh(pc, num_devices, process_count)
    except ValueError as e:
      raise ValueError(f"Phase {phase.index} of the run ({phase.describe()}):"
                       f" {e}") from None


def _check_sources(data) -> None:
  """Text globs match files and TFDS datasets are prepared (no reading).

  `sources` wins over `train_files`, `eval_sources` over `eval_files`.
  """
  from bert_jax.data import sources as data_sources  # TensorFlow's gfile.
  for primary, shorthand in (("sources", "train_files"),
                             ("eval_sources", "eval_files")):
    field = primary if data[primary] else shorthand
    spec = data[field]
    if not spec:
      continue
    srcs = (data_sources.parse_sources(spec, f"data.{field}")
            if field == primary else
            [data_sources.Source(data_sources.TEXT, spec)])
    for s in srcs:
      if s.kind == data_sources.TEXT:
        data_sources.resolve_text_files(s, f"data.{field}")
      else:
        data_sources.tfds_builder(s, data.tfds_data_dir)
