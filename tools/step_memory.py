r"""XLA's memory of a config's compiled train step (any objective, any kind).

  python tools/step_memory.py --config configs/pairs.py \
      --config.model.vocab_size=30522 --config.model.hidden_size=384 \
      --config.model.num_hidden_layers=6 \
      --config.model.num_attention_heads=12 \
      --config.model.intermediate_size=1536 \
      --config.data.seq_length=128 --config.task.buckets="(128,)" \
      --config.train.batch_size=64 --config.train.num_steps=10 \
      [--config.model.remat_policy=full] [--chunk 16]

Compiles the step ahead of time at the config's batch and longest length
(``benchmarking.train_step_memory``: nothing runs, no weights or data are
read, so the numbers do not depend on the machine's load) and prints its
peak and temporaries in MB, as ``tools/bench_embeddings.py``'s memory line
does for the model it benchmarks: vary one field at a time to see where
the memory goes (length, layers, dropout, attention, remat, cached
chunks).
"""

from __future__ import annotations

from absl import flags

from bert_jax import benchmarking
from bert_jax import cli


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("configs/<name>.py and overrides (the model's shape, "
                    "the batch, the lengths).", argv=argv, **define)
  flags.DEFINE_integer("chunk", 0, "train.cache_chunk_size (the pairs "
                       "kind's cached step): 0 = the plain step.", **define)


FLAGS = flags.FLAGS


def main(argv):
  del argv
  c = FLAGS.config
  m = benchmarking.train_step_memory(c, FLAGS.chunk)
  if not m:
    raise SystemExit("error: XLA reports no memory analysis for this "
                     "backend.")
  print(f"train step of objective {c.objective.name}, batch "
        f"{c.train.batch_size}, chunk {FLAGS.chunk}: peak "
        f"{m['peak_mb']:,.0f} MB, temporaries {m['temporaries_mb']:,.0f} MB")


if __name__ == "__main__":
  cli.run(main, define_flags)
