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

from bert_jax import compose
from bert_jax.data import shard_format
from bert_jax.models import bert
from bert_jax.training import cached_gradients
from bert_jax.training import optim
from bert_jax.training import phases as phases_lib
from bert_jax.training import preemption
from bert_jax.training import sharding
from bert_jax.training import start_from


def validate(config: ml_collections.ConfigDict, num_devices: int,
             process_count: int = 1, *,
             check_sources: bool = True) -> list[phases_lib.Phase]:
  """All static checks: objective (and the input it reads), model, train,
  mesh and phases. Returns the run's phases, resolved here once for the job
  to pass on (`Trainer(phases=...)`)."""
  compose.objective(config)  # Names one: ValueError listing them if not.
  bert.validate_model_config(config.model)
  _check_objective(config)
  phases = phases_lib.resolve(config)
  _check_train_and_mesh(config, num_devices, process_count, phases)
  _check_phases(config, phases, num_devices, process_count)
  if check_sources:
    _check_sources(config.data)
    for phase in phases:  # A phase's own sources.
      if dict(phase.data).get("sources"):
        _check_sources(phases_lib.phase_config(config, phase).data,
                       f"train.phases[{phase.index}].data")
  return phases


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
  model = config.model
  if model.positions_from_pad and tok.pad_id != int(model.pad_token_id):
    raise ValueError(
        f"model.pad_token_id={model.pad_token_id}, but the padding token of "
        f"the tokenizer {tok.path} is id {tok.pad_id}: positions count from "
        "the padding id (model.positions_from_pad), so they must agree; set "
        f"--config.model.pad_token_id={tok.pad_id}.")


def _check_objective(config) -> None:
  """The objective's checks (its `validate`): its own fields and those of
  the input it reads (`data.checks`), which differ by job."""
  compose.objective(config).validate(config)
  start_from.check_teacher(config)
  _check_packing(config)


def _check_packing(config) -> None:
  data = config.data
  if not data.get("packing", False):
    return
  name = config.objective.name
  if not compose.objective(config).packing:
    readers = compose.packing_objective_names()
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


def _check_train_and_mesh(config, num_devices: int, process_count: int,
                          phases):
  t = config.train
  if t.num_steps <= 0 or t.batch_size <= 0:
    raise ValueError(f"train.num_steps={t.num_steps} and train.batch_size="
                     f"{t.batch_size} must be positive.")
  if t.grad_accum_steps < 1:
    raise ValueError(f"train.grad_accum_steps={t.grad_accum_steps} must be "
                     ">= 1.")
  # Their modules own these decisions; building them is cheap and checks.
  optim.make_optimizer(t, optim.learning_rate_schedule(t, phases))
  preemption.NonFiniteMonitor(t.nonfinite_policy, t.max_nonfinite_in_a_row)
  if not 0.0 <= t.get("ema_decay", 0.0) < 1.0:
    raise ValueError(f"train.ema_decay={t.ema_decay} must be in [0, 1) "
                     "(0: no moving average).")
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
  cached_gradients.check(config, compose.objective(config), dp)
  if t.batch_size % process_count:
    raise ValueError(f"train.batch_size={t.batch_size} is not divisible by the "
                     f"process count {process_count}.")
  heads, tp = config.model.num_attention_heads, mesh_shape["tensor"]
  if heads % tp:
    raise ValueError(f"model.num_attention_heads={heads} is not divisible by "
                     f"mesh.tensor={tp}.")


def _check_phases(config, phases, num_devices: int,
                  process_count: int) -> None:
  """Each phase of train.phases / train.recipe (and each batch size of a
  warm-up) passes the shape checks."""
  if not phases_lib.is_phased(config) and not phases[0].ramp:
    return
  for phase in phases:
    pc = phases_lib.phase_config(config, phase)
    for size in phase.batch_sizes:
      pc.train.batch_size = size
      what = ("" if size == phase.batch_size else
              f", its warm-up batch of {size}")
      try:
        _check_objective(pc)
        _check_train_and_mesh(pc, num_devices, process_count, phases)
      except ValueError as e:
        raise ValueError(f"Phase {phase.index} of the run ("
                         f"{phase.describe()}{what}): {e}") from None


def _check_sources(data, group: str = "data") -> None:
  """Text globs match files and TFDS datasets are prepared (no reading).

  `sources` wins over `train_files`, `eval_sources` over `eval_files`;
  errors name the fields under `group` (a phase's: train.phases[i].data).
  """
  from bert_jax.data import sources as data_sources  # TensorFlow's gfile.
  for primary, shorthand in (("sources", "train_files"),
                             ("eval_sources", "eval_files")):
    field = primary if data[primary] else shorthand
    spec = data[field]
    if not spec:
      continue
    srcs = (data_sources.parse_sources(spec, f"{group}.{field}")
            if field == primary else
            [data_sources.Source(data_sources.TEXT, spec)])
    for s in srcs:
      if s.kind == data_sources.TFDS:
        data_sources.tfds_builder(s, data.tfds_data_dir)
      elif s.kind == data_sources.SHARDS:
        shard_format.read_manifest(s.spec, f"data.{field}")
      else:  # Text, JSONL or Parquet files (records: the first one's form).
        files, _ = data_sources.resolve_text_files(s, f"{group}.{field}")
        data_sources.check_records(
            s, files[0], data.get("text_field", "text"), f"{group}.{field}")
