r"""Fine-tuning throughput: bert_jax (length buckets, packed rows) vs Hugging
Face PyTorch.

Any task kind (sentence classification, token tagging, extractive QA):
``--config configs/ner.py`` / ``configs/squad.py`` benchmark
BertForTokenClassification / BertForQuestionAnswering on the task's windowed
features (the same windows on both sides; HF pads each batch to its longest).

  python tools/bench_finetune.py --config configs/finetune.py \
      --config.task.name=pydoc_topics --config.task.text_field=text \
      --config.task.train_file=/tmp/demo_task/train.csv \
      --config.task.validation_file=/tmp/demo_task/dev.csv \
      --config.train.init_from=MODEL --config.data.seq_length=128 \
      --config.train.batch_size=32 [--rounds 3 --steps 0 --warmup 2]

Same task rows, same tokenization (the checkpoint's tokenizer, through
bert_jax.data.task_data), same architecture (MODEL's config; weights are
random on both sides: speed does not depend on them), same batch size, dtype
(`--config.model.dtype`; bfloat16 means torch.autocast for PyTorch), AdamW
with gradient clipping and dropout 0.1 on both sides, in one process:

  bert_jax, buckets: the fine-tuning train step (`steps_lib.Programs`,
    `classify` objective) on the batches `task_data` makes: examples grouped
    by length into `task.buckets` static lengths, compiled once per bucket.
  bert_jax, packed (`--packed`, default on; sentence and token tasks): the
    same step with `data.packing=True`: several examples (windows) a row of
    `data.seq_length`, attention inside each (bert_jax/data/packing.py,
    feature_packing.py), one compile; `--packed_batch_size` rows a step (0:
    as many as hold `batch_size` examples on average, so that both bert_jax
    sides take the same number of examples a step).
  HF: `BertForSequenceClassification` (transformers, its default attention)
    on shuffled batches of the same rows padded to the batch's longest
    example, as `DataCollatorWithPadding` does (no fixed-length strawman);
    and again with the Trainer's `group_by_length=True` (its
    LengthGroupedSampler: batches of similar lengths, less padding), the
    peer's own way to cut padding.

With `--predict`, the evaluator's predict step over the validation split
(outputs read back to the host) on length buckets and on packed rows joins
the rounds: examples/s of prediction.

Both sides' batches are built before timing (input pipelines excluded). After
warm-up (every bucket compiled, `--warmup` steps each) the two alternate,
`--steps` steps at a time for `--rounds` rounds (0 steps: one epoch's batches
split over the rounds), so machine noise hits both (`bert_jax.benchmarking`). Reports examples/s, real
(non-pad) tokens/s, the fraction of computed positions that were padding and
the median step time. No accuracy is measured here.
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import flags

from bert_jax import benchmarking
from bert_jax import cli
from bert_jax.downstream import finetuning


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module.
  Only --config: the tool writes nothing but its report (no --workdir)."""
  define = dict(flag_values=flag_values)
  cli.define_config("configs/finetune.py, ner.py or squad.py and overrides.",
                    argv=argv, **define)
  cli.define_timing(steps=0, rounds=3, warmup=2, steps_help="Timed steps "
                    "per side per round; 0: one epoch's batches over all "
                    "rounds.", **define)
  flags.DEFINE_integer("torch_threads", 0, "torch.set_num_threads (0: torch's "
                       "default). On a loaded machine OpenMP's spinning makes "
                       "more threads slower; try 1.", **define)
  flags.DEFINE_string("json", "", "Also write the results to this file.",
                      **define)
  flags.DEFINE_bool("packed", True, "Also time bert_jax on packed rows.",
                    **define)
  flags.DEFINE_integer("packed_batch_size", 0, "Packed rows a step; 0: the "
                       "rows that hold train.batch_size examples on average.",
                       **define)
  flags.DEFINE_bool("predict", False, "Also time the evaluator's predict "
                    "step over the validation split, buckets vs packed "
                    "(examples/s).", **define)


FLAGS = flags.FLAGS


# ==============================================================================
# Data: one tokenization, two batchings.
# ==============================================================================
def tokenized_rows(rows, tok, seq_length: int) -> list[tuple[np.ndarray, ...]]:
  """(input_ids, segment_ids, label) per row, unpadded, as task_data encodes
  them ([CLS] A [SEP] (B [SEP]), longest-first truncation)."""
  from bert_jax.data import task_data
  out = [None] * len(rows)
  for b in task_data.eval_batches(rows, tok, seq_length=seq_length,
                                  batch_size=256, buckets=(seq_length,)):
    for i in range(len(b["labels"])):
      idx = int(b[task_data.INDEX][i])
      if idx < 0:
        continue
      n = int(b["input_mask"][i].sum())
      out[idx] = (b["input_ids"][i, :n], b["segment_ids"][i, :n],
                  b["labels"][i])
  return out


def hf_order(lengths, batch_size: int, seed: int,
             group_by_length: bool) -> np.ndarray:
  """The order Hugging Face's Trainer reads the rows in: a random
  permutation, or with `group_by_length` its LengthGroupedSampler's
  (transformers' own ``get_length_grouped_indices``: megabatches of 50
  batches, each sorted longest first), whose full batches are then timed in
  a random order, so that the timed ones are not the longest of the first
  megabatch."""
  if not group_by_length:
    return np.random.default_rng(seed).permutation(len(lengths))
  import torch
  from transformers import trainer_pt_utils
  order = np.asarray(trainer_pt_utils.get_length_grouped_indices(
      list(lengths), batch_size,
      generator=torch.Generator().manual_seed(seed)))
  full = len(order) // batch_size
  batches = order[:full * batch_size].reshape(full, batch_size)
  return batches[np.random.default_rng(seed).permutation(full)].reshape(-1)


def dynamic_batches(encoded, batch_size: int, pad_id: int, seed: int,
                    group_by_length: bool = False):
  """Full batches padded to their longest row (numpy), in `hf_order`."""
  order = hf_order([len(r[0]) for r in encoded], batch_size, seed,
                   group_by_length)
  batches = []
  for lo in range(0, len(order) - batch_size + 1, batch_size):
    rows = [encoded[i] for i in order[lo:lo + batch_size]]
    t = max(len(r[0]) for r in rows)
    ids = np.full((batch_size, t), pad_id, np.int64)
    seg = np.zeros((batch_size, t), np.int64)
    mask = np.zeros((batch_size, t), np.int64)
    for j, (a, s, _) in enumerate(rows):
      ids[j, :len(a)], seg[j, :len(a)], mask[j, :len(a)] = a, s, 1
    labels = np.asarray([r[2] for r in rows])
    labels = labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64)
    batches.append(dict(input_ids=ids, token_type_ids=seg,
                        attention_mask=mask, labels=labels))
  return batches


def feature_rows(features, kind: str) -> list[dict]:
  """Token / span task features as unpadded per-window numpy rows, with the
  Hugging Face label names (token tags -100 where not learned)."""
  out = []
  for i in range(len(features)):
    r = features.rows([i], int(features.lengths[i]), 0)
    row = dict(input_ids=r["input_ids"][0], token_type_ids=r["segment_ids"][0])
    if kind == "token":
      row["labels"] = np.where(r["label_weights"][0] > 0, r["labels"][0], -100)
    else:
      row["start_positions"] = r["start_positions"][0]
      row["end_positions"] = r["end_positions"][0]
    out.append(row)
  return out


def dynamic_feature_batches(rows, batch_size: int, pad_id: int, seed: int,
                            group_by_length: bool = False):
  """Full batches of `feature_rows`, padded to their longest, in
  `hf_order`."""
  order = hf_order([len(r["input_ids"]) for r in rows], batch_size, seed,
                   group_by_length)
  batches = []
  for lo in range(0, len(order) - batch_size + 1, batch_size):
    chosen = [rows[i] for i in order[lo:lo + batch_size]]
    t = max(len(r["input_ids"]) for r in chosen)
    b = dict(input_ids=np.full((batch_size, t), pad_id, np.int64),
             token_type_ids=np.zeros((batch_size, t), np.int64),
             attention_mask=np.zeros((batch_size, t), np.int64))
    if "labels" in chosen[0]:
      b["labels"] = np.full((batch_size, t), -100, np.int64)
    for j, r in enumerate(chosen):
      n = len(r["input_ids"])
      b["input_ids"][j, :n], b["token_type_ids"][j, :n] = (
          r["input_ids"], r["token_type_ids"])
      b["attention_mask"][j, :n] = 1
      if "labels" in b:
        b["labels"][j, :n] = r["labels"]
    for k in ("start_positions", "end_positions"):
      if k in chosen[0]:
        b[k] = np.asarray([r[k] for r in chosen], np.int64)
    batches.append(b)
  return batches


def trainer_batches(rows, tok, config, num: int):
  """The fine-tuning trainer's own train batches (task_data: buckets, or
  packed rows with data.packing), `num` of them."""
  from bert_jax.data import packing
  from bert_jax.data import task_data
  it = task_data.create_train_iterator(
      rows, tok, batch_size=config.train.batch_size, seed=config.train.seed,
      seq_length=config.data.seq_length, buckets=tuple(config.task.buckets),
      packing=packing.PackingOptions.from_config(config.data))
  return [next(it) for _ in range(num)]


def packed_config(config, rows, tok, batch_size: int):
  """`config` with data.packing on and `batch_size` rows a step (0: the
  rows that hold train.batch_size examples on average)."""
  from bert_jax.data import packing
  from bert_jax.data import task_data
  c = config.copy_and_resolve_references()
  c.data.packing = True
  if batch_size <= 0:
    n_rows = task_data.packed_rows_per_epoch(
        rows, tok, seq_length=c.data.seq_length,
        packing=packing.PackingOptions.from_config(c.data))
    batch_size = max(1, round(config.train.batch_size * n_rows / len(rows)))
  c.train.batch_size = int(batch_size)
  return c


# ==============================================================================
# The two sides: run(n) -> per-step (seconds, examples, real tokens, positions).
# ==============================================================================
class Side(benchmarking.Side):
  """Fine-tuning steps on `batches` (host arrays); `mask_key` marks their
  real tokens."""

  def __init__(self, batches, mask_key: str):
    super().__init__(len(batches))
    self.host_batches = batches
    self.stats = [(int(np.sum(b[mask_key] > 0)), int(np.size(b[mask_key])))
                  for b in batches]
    self.shapes = sorted({tuple(np.shape(b[mask_key])) for b in batches})

  def examples(self, k: int) -> int:
    raise NotImplementedError

  def summary(self) -> dict:
    r = np.asarray([(dt, self.examples(k)) + self.stats[k]
                    for dt, k in zip(self.times, self.batches)], np.float64)
    secs = r[:, 0].sum()
    return dict(side=self.name, steps=len(r), seconds=float(secs),
                examples_per_s=float(r[:, 1].sum() / secs),
                real_tokens_per_s=float(r[:, 2].sum() / secs),
                padding_fraction=float(1 - r[:, 2].sum() / r[:, 3].sum()),
                step_ms_p50=float(1e3 * np.median(r[:, 0])),
                shapes=[list(s) for s in self.shapes])


class Ours(Side):
  """bert_jax's jitted fine-tuning step on bucketed, device-resident batches."""

  def __init__(self, config, batches):
    import jax

    from bert_jax import compose
    from bert_jax.training import sharding
    from bert_jax.training import steps as steps_lib
    super().__init__(batches, "input_mask")
    self.jax = jax
    objective = compose.objective(config)
    self.programs = p = steps_lib.Programs(config, sharding.make_mesh(config.mesh),
                                       objective)
    names = objective.feature_spec(config)
    with p.context():
      self.state = p.init()
    self.device_batches = [
        sharding.global_batch({k: b[k] for k in names}, p.batch_sharding)
        for b in batches]
    if config.data.get("packing", False):
      self.name = (f"bert_jax, packed {len(batches[0]['input_ids'])} x "
                   f"{config.data.seq_length} ({config.model.dtype})")
    else:
      buckets = ",".join(str(s[1]) for s in self.shapes)
      self.name = f"bert_jax, buckets {buckets} ({config.model.dtype})"
    t = time.perf_counter()
    seen = set()
    for k, b in enumerate(batches):  # Compile every bucket once.
      if b["input_ids"].shape not in seen:
        seen.add(b["input_ids"].shape)
        self.step(k)
    self.compile_seconds = time.perf_counter() - t

  def step(self, k: int):
    with self.programs.context():
      self.state, metrics = self.programs.train_step(self.state,
                                                     self.device_batches[k])
    metrics["loss"].block_until_ready()

  def examples(self, k: int) -> int:
    w = self.host_batches[k].get("example_weights")
    return (len(self.host_batches[k]["input_ids"]) if w is None
            else int(w.sum()))


# The Hugging Face class of each objective's model.
HF_CLASSES = {"classify": "BertForSequenceClassification",
              "token_classify": "BertForTokenClassification",
              "span_qa": "BertForQuestionAnswering"}


class HuggingFace(Side):
  """transformers Bert(ForSequenceClassification, ForTokenClassification,
  ForQuestionAnswering) + torch AdamW, dynamic padding."""

  def __init__(self, config, num_labels: int, batches,
               group_by_length: bool = False):
    import torch
    import transformers

    from bert_jax.families import bert as bert_family
    super().__init__(batches, "attention_mask")
    self.torch = torch
    cls = HF_CLASSES[config.objective.name]
    cfg = dict(bert_family.config_to_hf(config.model, architecture=cls),
               num_labels=num_labels)
    cfg.pop("dtype", None)
    torch.manual_seed(0)
    self.model = getattr(transformers, cls)(
        transformers.BertConfig(**cfg)).train()
    t = config.train
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=t.learning_rate,
                                 betas=(t.adam_b1, t.adam_b2), eps=t.adam_eps,
                                 weight_decay=t.weight_decay)
    self.max_grad_norm = t.max_grad_norm
    self.bf16 = config.model.dtype == "bfloat16"
    self.tensors = [{k: torch.from_numpy(v) for k, v in b.items()}
                    for b in batches]
    self.name = (f"HF torch, dynamic padding"
                 f"{', group_by_length' if group_by_length else ''} ("
                 f"{'bf16 autocast' if self.bf16 else 'float32'}, "
                 f"{torch.get_num_threads()} threads)")
    self.versions = (f"torch {torch.__version__}, transformers "
                     f"{transformers.__version__}")

  def step(self, k: int):
    torch = self.torch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
      loss = self.model(**self.tensors[k]).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    float(loss.detach())

  def examples(self, k: int) -> int:
    return len(self.host_batches[k]["input_ids"])


# ==============================================================================
# Prediction: the evaluator's predict step over the validation split.
# ==============================================================================
class Predict(benchmarking.Side):
  """The predict step (`steps.predict_step`: outputs of every row, read
  back to the host, as the evaluator does) over a split's eval batches."""

  def __init__(self, config, batches, name: str):
    import jax

    from bert_jax import compose
    from bert_jax.data import feature_batches
    from bert_jax.training import sharding
    from bert_jax.training import steps as steps_lib
    super().__init__(len(batches))
    self.jax, self.name = jax, name
    objective = compose.objective(config)
    self.programs = p = steps_lib.Programs(
        config, sharding.make_mesh(config.mesh), objective)
    names = objective.feature_spec(config)
    with p.context():
      self.params = p.init()["params"]
    self.device_batches = [
        sharding.global_batch({k: b[k] for k in names}, p.batch_sharding)
        for b in batches]
    self.counts = [int(np.sum(b[feature_batches.INDEX] >= 0))
                   for b in batches]
    self.shapes = sorted({tuple(b["input_ids"].shape) for b in batches})
    t = time.perf_counter()
    self.run(len(batches), record=False)  # Every shape compiled once.
    self.compile_seconds = time.perf_counter() - t

  def step(self, k: int):
    with self.programs.context():
      out = self.programs.predict_step(self.params, self.device_batches[k],
                                       self.programs.eval_rng(k), None)
    self.jax.device_get(out)

  def summary(self) -> dict:
    secs = float(np.sum(self.times))
    n = sum(self.counts[k] for k in self.batches)
    return dict(side=self.name, steps=len(self.times), seconds=secs,
                examples_per_s=n / secs,
                shapes=[list(s) for s in self.shapes])


def predict_sides(kind, config, tok, spec, train_rows, eval_rows,
                  packed: bool, packed_batch_size: int):
  """Predict sides on the validation split: length buckets, and packed
  rows (`packed_batch_size` rows a batch) when the kind packs."""
  configs = [(config, "bert_jax predict, buckets")]
  if packed and kind.packing:
    c = config.copy_and_resolve_references()
    c.data.packing = True
    c.train.batch_size = packed_batch_size
    configs.append((c, f"bert_jax predict, packed {packed_batch_size} x "
                    f"{c.data.seq_length}"))
  sides = []
  for c, name in configs:
    inputs = kind.make_input(c, tok, spec, train_rows, eval_rows)
    sides.append(Predict(c, inputs.eval_batches, name))
  return sides


# ==============================================================================
# Benchmark.
# ==============================================================================
def packed_feature_batch_size(features, config) -> int:
  """Packed rows that hold train.batch_size windows on average."""
  from bert_jax.data import feature_packing
  rows = feature_packing.rows_per_epoch(
      features, feature_packing.Shape.from_config(config.data))
  return max(1, round(config.train.batch_size * rows / len(features)))


def benchmark(config, rounds: int, steps: int, warmup: int,
              torch_threads: int = 0, packed: bool = True,
              packed_batch_size: int = 0, predict: bool = False) -> dict:
  import jax
  if torch_threads:
    import torch
    torch.set_num_threads(torch_threads)
  from bert_jax.data import task_data
  source, kind, spec, train_rows, eval_rows, tok = (
      benchmarking.read_finetuning_task(config))
  pad_id = 0 if tok.pad_id is None else int(tok.pad_id)
  b = config.train.batch_size
  config = config.copy_and_resolve_references()
  config.data.packing = False  # The buckets' side; packed sides turn it on.
  if kind.name == "sentence":
    num_train = len(train_rows)
  else:  # Windowed features, the same for every side.
    inputs = kind.make_input(config, tok, spec, train_rows, {})
    num_train = inputs.num_train
  config = finetuning.resolve_config(config, source, spec, num_train)
  epoch = task_data.steps_per_epoch(num_train, b)
  if steps <= 0:
    steps = max(1, epoch // rounds)
  need = max(epoch, steps)
  pc = None
  if kind.name == "sentence":
    encoded = tokenized_rows(train_rows, tok, config.data.seq_length)
    hf_batches = [dynamic_batches(encoded, b, pad_id, config.train.seed,
                                  grouped) for grouped in (False, True)]
    sides = [Ours(config, trainer_batches(train_rows, tok, config, need))]
    if packed:
      pc = packed_config(config, train_rows, tok, packed_batch_size)
      sides.append(Ours(pc, trainer_batches(train_rows, tok, pc, need)))
  else:
    features = inputs.train_iter.features
    hf_rows = feature_rows(features, kind.name)
    hf_batches = [dynamic_feature_batches(hf_rows, b, pad_id,
                                          config.train.seed, grouped)
                  for grouped in (False, True)]
    sides = [Ours(config, [next(inputs.train_iter) for _ in range(need)])]
    if packed and kind.packing:
      pc = config.copy_and_resolve_references()
      pc.data.packing = True
      pc.train.batch_size = (packed_batch_size or
                             packed_feature_batch_size(features, pc))
      it = kind.make_input(pc, tok, spec, train_rows, {}).train_iter
      sides.append(Ours(pc, [next(it) for _ in range(need)]))
  ours = sides[0]
  hf, grouped = (HuggingFace(config, spec.num_labels, batches, group)
                 for batches, group in zip(hf_batches, (False, True)))
  sides += [hf, grouped]
  if predict:
    sides += predict_sides(kind, config, tok, spec, train_rows, eval_rows,
                           pc is not None, pc.train.batch_size if pc else 0)
  benchmarking.alternate(sides, warmup=warmup, rounds=rounds, steps=steps)
  rows = [side.summary() for side in sides]
  train = [r for r, s in zip(rows, sides) if not isinstance(s, Predict)]
  hf_rate, grouped_rate = (train[i]["examples_per_s"] for i in (-2, -1))
  m = config.model
  return dict(
      task=spec.name, kind=kind.name, train_rows=num_train, batch_size=b,
      seq_length=config.data.seq_length, buckets=list(config.task.buckets),
      model=f"{m.num_hidden_layers}x{m.hidden_size} ({m.num_attention_heads} "
      f"heads, vocab {m.vocab_size})", dtype=m.dtype,
      rounds=rounds, steps_per_round=steps, warmup=warmup,
      ours_compile_seconds=ours.compile_seconds,
      over_hf={r["side"]: r["examples_per_s"] / hf_rate for r in train[:-2]},
      over_hf_grouped={r["side"]: r["examples_per_s"] / grouped_rate
                       for r in train[:-2]},
      versions=f"jax {jax.__version__} ({jax.devices()[0].platform}); "
      f"{hf.versions}",
      cpu_count=os.cpu_count(), load_average=list(os.getloadavg()),
      results=train, predict=rows[len(train):],
      ours_over_hf=rows[0]["examples_per_s"] / hf_rate)


def format_report(r: dict) -> str:
  lines = [
      f"Fine-tuning throughput, task {r['task']} ({r['train_rows']} "
      "training sequences), "
      f"model {r['model']}, batch {r['batch_size']}, seq <= "
      f"{r['seq_length']}, {r['dtype']}; {r['rounds']} rounds x "
      f"{r['steps_per_round']} steps per side, alternating, after "
      f"{r['warmup']} warm-up steps; load average "
      f"{', '.join(f'{x:.1f}' for x in r['load_average'])} on "
      f"{r['cpu_count']} CPUs; {r['versions']}.",
      f"{'':<64} {'examples/s':>10} {'tokens/s':>9} {'padding':>8} "
      f"{'p50 ms':>8}"]
  for s in r["results"]:
    lines.append(f"{s['side']:<64} {s['examples_per_s']:>10.1f} "
                 f"{s['real_tokens_per_s']:>9.0f} "
                 f"{100 * s['padding_fraction']:>7.1f}% "
                 f"{s['step_ms_p50']:>8.1f}")
  for side, ratio in r["over_hf"].items():
    lines.append(f"{side} / HF examples/s: {ratio:.2f}x; / HF "
                 f"group_by_length: {r['over_hf_grouped'][side]:.2f}x")
  for s in r.get("predict", []):
    lines.append(f"{s['side']:<64} {s['examples_per_s']:>10.1f} examples/s "
                 f"(validation, {len(s['shapes'])} shapes)")
  lines.append(f"(bert_jax buckets compiled {len(r['results'][0]['shapes'])} "
               f"shapes in {r['ours_compile_seconds']:.1f} s, excluded)")
  return "\n".join(lines)


def main(argv):
  del argv
  benchmarking.report(
      lambda: benchmark(FLAGS.config, FLAGS.rounds, FLAGS.steps, FLAGS.warmup,
                        FLAGS.torch_threads, FLAGS.packed,
                        FLAGS.packed_batch_size, FLAGS.predict),
      format_report, FLAGS.json)


if __name__ == "__main__":
  cli.run(main, define_flags)
