"""Training phases of one run: BERT's 128 -> 512 recipe, ModernBERT's
context extension (1,024 -> 8,192 tokens with a larger global RoPE base).

Devlin et al. 2019 trained 90% of the steps at 128 tokens (20 predictions)
and the rest at 512 (80 predictions); NVIDIA's and google-research's recipes
do the same because attention at 512 is where time goes. A phase is a span of
steps with its own batch shape (and, with the "per_phase" schedule, its own
warmup and decay). One run walks through the phases: the optimizer state
carries over, the pipeline switches to the new shapes (continuing after the
examples already consumed, the rule that also resumes a run whose shapes
changed, `data/iterator.py`), and each phase's step is compiled before step 1.

`train.phases` lists them explicitly; `train.recipe="bert_two_phase"` builds
the published split from `train.num_steps`; with neither, the run is one
phase of the `data` / `train` shapes. A phase's optional "model" entry
overrides fields that change the function but not the parameters
(``config_lib.PHASE_MODEL_FIELDS``, e.g. ``{"global_rope_theta": 1.6e6}``):
that phase's step is compiled from its own model graph over the same state.
A phase's optional "data" entry overrides data fields
(``config_lib.PHASE_DATA_FIELDS``: the masking, the sources and how they
mix, e.g. mmBERT's ``{"mask_rate": 0.05, "source_temperature": 3.33}``):
that phase's pipeline is built with them; its batches keep their features.

A batch-size warm-up (``train.batch_warmup`` for the first phase, or a
phase's "batch_warmup" entry: ``{"start": S, "increment": I, "tokens": N}``)
runs the phase's first steps at the global batch sizes S, S + I, ... below
its batch_size, the same number of steps k each, k = round(N / (seq_length
x the sum of those sizes)) so that they take N tokens, ModernBERT's rule
(its scheduler holds each size for tokens in proportion to it). Each size's
step is compiled before step 1; the pipeline batches at the sizes' greatest
common divisor and a step takes as many of those batches as its size needs
(``data/iterator.py``), so the data order is one stream whatever the sizes
and resumes exactly.
"""

from __future__ import annotations

import dataclasses
import math
import zlib

import ml_collections

from bert_jax import config_lib

# google-research/bert: 90% of steps at 128 tokens (20 predictions), then 512
# (80 predictions), the same batch. NVIDIA's phase 2 warms up over 12.8% of
# its steps.
TWO_PHASE_SHARE = 0.9
TWO_PHASE_SHAPES = ((128, 20), (512, 80))
TWO_PHASE_WARMUP = 0.128
RECIPES = ("", "bert_two_phase")
SCHEDULES = ("per_phase", "continuous")
# Where a later phase's data starts: "reshuffle" runs the pipeline again with
# a seed of its own (google-research/bert and NVIDIA read a separate phase-2
# dataset; costs nothing at the switch); "continue" skips the examples the
# run already consumed (the data order of one pipeline; the skip reads and
# tokenizes all of them, minutes for short runs, hours for BERT's 900k steps).
DATA_POLICIES = ("reshuffle", "continue")
FIELDS = ("num_steps", "seq_length", "max_predictions_per_seq", "batch_size")
OPTIONAL_FIELDS = ("learning_rate", "warmup_steps", "decay_steps",
                   "warmup_tokens", "decay_tokens", "batch_warmup", "data",
                   "model")
WARMUP_FIELDS = ("start", "increment", "tokens")


@dataclasses.dataclass(frozen=True)
class Phase:
  """Steps [start, end) with one batch shape and learning-rate schedule."""
  index: int
  start: int
  num_steps: int
  seq_length: int
  max_predictions_per_seq: int
  batch_size: int
  learning_rate: float
  warmup_steps: int
  decay_steps: int = 0  # train.schedule "wsd": this phase's decay.
  # (field, value) pairs of config_lib.PHASE_MODEL_FIELDS overridden.
  model: tuple = ()
  # (field, value) pairs of config_lib.PHASE_DATA_FIELDS overridden.
  data: tuple = ()
  # train.schedule_unit "tokens": this phase's warmup and decay.
  warmup_tokens: int = 0
  decay_tokens: int = 0
  # Batch-size warm-up: ((first step from the phase's start, global batch),
  # ...) ascending, the last one batch_size; () = batch_size throughout.
  ramp: tuple = ()

  @property
  def end(self) -> int:
    return self.start + self.num_steps

  def batch_at(self, step: int) -> int:
    """The global batch of step index `step` (0-based, of the run)."""
    size = self.batch_size
    for first, b in self.ramp:
      if step - self.start >= first:
        size = b
    return size

  @property
  def batch_sizes(self) -> tuple[int, ...]:
    return tuple(b for _, b in self.ramp) or (self.batch_size,)

  @property
  def unit(self) -> int:
    """Rows the pipeline batches at: every size of the phase is a multiple."""
    return math.gcd(*self.batch_sizes)

  def segments(self) -> list[tuple[int, int, int]]:
    """(first step, steps, global batch) spans of one batch size."""
    ramp = self.ramp or ((0, self.batch_size),)
    ends = [first for first, _ in ramp[1:]] + [self.num_steps]
    return [(self.start + first, end - first, b)
            for (first, b), end in zip(ramp, ends)]

  @property
  def tokens(self) -> int:
    """Tokens (batch x seq_length, padding included) of the whole phase."""
    return sum(n * b for _, n, b in self.segments()) * self.seq_length

  def describe(self) -> str:
    model = "".join(f", model.{k} {v}" for k, v in self.model)
    data = "".join(f", data.{k} {v}" for k, v in self.data)
    warmup = ""
    if self.ramp:
      sizes = [b for _, b in self.ramp[:-1]]
      warmup = (f" after a warm-up at {', '.join(map(str, sizes))} "
                f"({self.ramp[1][0]} steps each)")
    return (f"seq_length {self.seq_length}, max_predictions_per_seq "
            f"{self.max_predictions_per_seq}, batch_size {self.batch_size}"
            + warmup + data + model)


def resolve(config: ml_collections.ConfigDict) -> list[Phase]:
  """The run's phases, in order (at least one). Raises ValueError with the
  field when `train.phases` / `train.recipe` are malformed."""
  t, d = config.train, config.data
  recipe = t.recipe
  if recipe not in RECIPES:
    raise ValueError(f"train.recipe={recipe!r} is not one of {RECIPES[1:]} "
                     "(or empty).")
  if t.phase_schedule not in SCHEDULES:
    raise ValueError(f"train.phase_schedule={t.phase_schedule!r} is not one "
                     f"of {SCHEDULES}.")
  if t.phase_data not in DATA_POLICIES:
    raise ValueError(f"train.phase_data={t.phase_data!r} is not one of "
                     f"{DATA_POLICIES}.")
  if recipe and t.phases:
    raise ValueError("Set either train.phases or train.recipe, not both.")
  if recipe == "bert_two_phase":
    first = int(round(TWO_PHASE_SHARE * t.num_steps))
    if not 0 < first < t.num_steps:
      raise ValueError(f"train.recipe='bert_two_phase' needs train.num_steps"
                       f" >= 2 (got {t.num_steps}).")
    second = t.num_steps - first
    specs = [dict(num_steps=first, seq_length=TWO_PHASE_SHAPES[0][0],
                  max_predictions_per_seq=TWO_PHASE_SHAPES[0][1],
                  batch_size=t.batch_size),
             dict(num_steps=second, seq_length=TWO_PHASE_SHAPES[1][0],
                  max_predictions_per_seq=TWO_PHASE_SHAPES[1][1],
                  batch_size=t.batch_size,
                  warmup_steps=math.ceil(TWO_PHASE_WARMUP * second))]
  elif t.phases:
    specs = _phase_specs(t.phases)
  else:
    specs = [dict(num_steps=t.num_steps, seq_length=d.seq_length,
                  max_predictions_per_seq=d.max_predictions_per_seq,
                  batch_size=t.batch_size)]
  out, start = [], 0
  for i, spec in enumerate(specs):
    unknown = set(spec) - set(FIELDS) - set(OPTIONAL_FIELDS)
    missing = set(FIELDS) - set(spec)
    if unknown or missing:
      raise ValueError(
          f"train.phases[{i}] has " + "; ".join(
              filter(None, [unknown and f"unknown keys {sorted(unknown)}",
                            missing and f"no {sorted(missing)}"])) +
          f" (each phase sets {', '.join(FIELDS)}; optional "
          f"{', '.join(OPTIONAL_FIELDS)}).")
    for field in FIELDS:
      if whole_number(spec[field], f"train.phases[{i}].{field}") <= 0:
        raise ValueError(f"train.phases[{i}].{field}={spec[field]} must be "
                         "positive.")
    model = _as_dict(spec.get("model") or {})
    _check_phase_fields(model, config_lib.PHASE_MODEL_FIELDS,
                        f"train.phases[{i}].model",
                        "fields that keep the parameters' shapes")
    tokens = {k: whole_number(spec.get(k, t.get(k, 0)), f"train.phases[{i}].{k}")
              for k in ("warmup_tokens", "decay_tokens")}
    if "batch_warmup" in spec:
      warmup, field = spec["batch_warmup"], f"train.phases[{i}].batch_warmup"
    else:  # The run's warm-up is its first phase's.
      warmup, field = (t.get("batch_warmup") if i == 0 else None,
                       "train.batch_warmup")
    out.append(Phase(
        index=i, start=start, num_steps=int(spec["num_steps"]),
        seq_length=int(spec["seq_length"]),
        max_predictions_per_seq=int(spec["max_predictions_per_seq"]),
        batch_size=int(spec["batch_size"]),
        learning_rate=float(spec.get("learning_rate", t.learning_rate)),
        warmup_steps=int(spec.get("warmup_steps", t.warmup_steps)),
        decay_steps=int(spec.get("decay_steps", t.decay_steps)),
        model=tuple(sorted(model.items())),
        data=_data_overrides(spec.get("data"), d, f"train.phases[{i}].data"),
        ramp=_ramp(warmup, int(spec["batch_size"]), int(spec["seq_length"]),
                   int(spec["num_steps"]), field),
        **tokens))
    start += out[-1].num_steps
  if start != t.num_steps:
    raise ValueError(f"train.phases add up to {start} steps but "
                     f"train.num_steps={t.num_steps}; make them equal.")
  return out


def _check_phase_fields(entry: dict, allowed, field: str, why: str) -> None:
  """ValueError naming `field` when its `entry` sets what a phase may not
  change: only the `allowed` fields, and `why` them."""
  bad = sorted(set(entry) - set(allowed))
  if bad:
    raise ValueError(f"{field} sets {bad}: a phase may change only "
                     f"{', '.join(allowed)} ({why}).")


def _data_overrides(entry, data, field: str) -> tuple:
  """A phase's "data" entry as sorted (field, value) pairs, each value of
  its default's type; ValueError naming the field for anything else."""
  entry = _as_dict(entry or {}) if _is_mapping(entry or {}) else entry
  if not isinstance(entry, dict):
    raise ValueError(f"{field}={entry!r} must be a dict of data fields, e.g. "
                     "{'mask_rate': 0.3}.")
  _check_phase_fields(entry, config_lib.PHASE_DATA_FIELDS, field,
                      "not the features a batch holds, the tokenizer or the "
                      "held-out data")
  out = {}
  for key, value in entry.items():
    default, name = data[key], f"{field}.{key}"
    if isinstance(default, bool) or isinstance(default, str):
      if type(value) is not type(default):
        raise ValueError(f"{name}={value!r} must be a "
                         f"{type(default).__name__}.")
    elif isinstance(default, int):
      value = whole_number(value, name)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
      raise ValueError(f"{name}={value!r} must be a number.")
    out[key] = type(default)(value)
  return tuple(sorted(out.items()))


def _ramp(warmup, batch_size: int, seq_length: int, num_steps: int,
          field: str) -> tuple:
  """Phase.ramp of a batch_warmup entry ({"start", "increment", "tokens"};
  start 0 or no entry: no warm-up); ValueError naming the field."""
  if warmup is None:
    return ()
  if not _is_mapping(warmup):
    raise ValueError(f"{field}={warmup!r} must be a dict with "
                     f"{', '.join(WARMUP_FIELDS)}.")
  w = _as_dict(warmup)
  unknown = sorted(set(w) - set(WARMUP_FIELDS))
  if unknown:
    raise ValueError(f"{field} has unknown keys {unknown} (it sets "
                     f"{', '.join(WARMUP_FIELDS)}).")
  start, increment, tokens = (whole_number(w.get(k, 0), f"{field}.{k}")
                              for k in WARMUP_FIELDS)
  if start == 0:
    return ()
  if not 0 < start < batch_size:
    raise ValueError(f"{field}.start={start} must be in (0, the phase's "
                     f"batch_size={batch_size}).")
  if increment <= 0 or tokens <= 0:
    raise ValueError(f"{field}.increment={increment} and .tokens={tokens} "
                     "must be positive.")
  sizes = list(range(start, batch_size, increment))
  each = round(tokens / (seq_length * sum(sizes)))
  if each < 1:
    raise ValueError(
        f"{field}.tokens={tokens} is less than one step at each of the "
        f"sizes {sizes} ({seq_length * sum(sizes)} tokens at seq_length "
        f"{seq_length}).")
  if each * len(sizes) >= num_steps:
    raise ValueError(
        f"{field}: the warm-up takes {each * len(sizes)} steps ({each} at "
        f"each of {len(sizes)} sizes), not fewer than the phase's num_steps="
        f"{num_steps}.")
  return tuple((k * each, b) for k, b in enumerate(sizes)) + (
      (len(sizes) * each, batch_size),)


# The form train.phases takes, quoted by every error about its shape.
_PHASES_FORM = ("a tuple of dicts, one per phase, e.g. --config.train.phases="
                "\"({'num_steps': 900, 'seq_length': 128, "
                "'max_predictions_per_seq': 20, 'batch_size': 256}, "
                "{'num_steps': 100, 'seq_length': 512, "
                "'max_predictions_per_seq': 80, 'batch_size': 256})\"")


def _phase_specs(phases) -> list[dict]:
  """train.phases as a list of dicts; ValueError naming the field and the
  expected form when it is something else (a number, a bare dict, ...)."""
  if _is_mapping(phases) or not isinstance(phases, (list, tuple)) or not any(
      _is_mapping(p) for p in phases):
    hint = (" (one phase still goes in a tuple: add a trailing comma, "
            "\"({...},)\")" if _is_mapping(phases) else "")
    raise ValueError(f"train.phases={phases!r} must be {_PHASES_FORM}"
                     f"{hint}.")
  for i, spec in enumerate(phases):
    if not _is_mapping(spec):
      raise ValueError(f"train.phases[{i}]={spec!r} is not a dict: "
                       f"train.phases must be {_PHASES_FORM}.")
  return [_as_dict(p) for p in phases]


def _as_dict(spec) -> dict:
  return dict(spec.to_dict() if hasattr(spec, "to_dict") else spec)


def _is_mapping(x) -> bool:
  return isinstance(x, (dict, ml_collections.ConfigDict))


def whole_number(value, field: str) -> int:
  """`value` as an int; ValueError naming `field` unless a whole number."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or (
      isinstance(value, float) and not value.is_integer()):
    raise ValueError(f"{field}={value!r} must be a whole number.")
  return int(value)


def at_step(phases: list[Phase], step: int) -> Phase:
  """The phase that runs step index `step` (0-based; past the end: last)."""
  for phase in phases:
    if step < phase.end:
      return phase
  return phases[-1]


def phase_config(config: ml_collections.ConfigDict,
                 phase: Phase) -> ml_collections.ConfigDict:
  """`config` with the phase's shapes in `data` / `train`: what its input
  pipeline and compiled step are built from. With train.phase_data
  "reshuffle", phases after the first get a pipeline seed of their own."""
  out = ml_collections.ConfigDict(config.to_dict())
  out.data.seq_length = phase.seq_length
  out.data.max_predictions_per_seq = phase.max_predictions_per_seq
  out.train.batch_size = phase.batch_size
  for field, value in phase.model:
    out.model[field] = type(out.model[field])(value)
  for field, value in phase.data:
    out.data[field] = value
  if phase.index and config.train.phase_data == "reshuffle":
    out.train.seed = zlib.crc32(f"{config.train.seed}/phase{phase.index}"
                                .encode())
  return out


def is_phased(config: ml_collections.ConfigDict) -> bool:
  return bool(config.train.recipe or config.train.phases)


def segments(phases: list[Phase]) -> list[tuple[int, int, int]]:
  """(first step, steps, tokens per step) of every span of one batch shape,
  in order: what a step's tokens are (batch x seq_length, padding
  included)."""
  return [(first, n, b * p.seq_length) for p in phases
          for first, n, b in p.segments()]


def tokens_before(phases: list[Phase], step: int) -> int:
  """Tokens of the steps before step index `step` (0-based)."""
  return sum(per * min(max(step - first, 0), n)
             for first, n, per in segments(phases))
