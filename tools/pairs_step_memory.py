r"""XLA's memory of the pairs kind's compiled train step, for one config.

  python tools/pairs_step_memory.py --config configs/pairs.py \
      --config.model.vocab_size=30522 --config.model.hidden_size=384 \
      --config.model.num_hidden_layers=6 \
      --config.model.num_attention_heads=12 \
      --config.model.intermediate_size=1536 \
      --config.data.seq_length=128 --config.task.buckets="(128,)" \
      --config.train.batch_size=64 --config.train.num_steps=10 \
      [--config.model.remat_policy=full] [--chunk 16]

Compiles the step ahead of time at the config's batch and longest bucket
(nothing runs, no weights are read: the shapes are the config's) and prints
its peak and temporaries in MB, as ``tools/bench_embeddings.py``'s memory
line does for the model it benchmarks: vary one field at a time to see
where the memory goes (text length, dropout, attention, remat, cached
chunks).
"""

from __future__ import annotations

from absl import flags

from bert_jax import benchmarking
from bert_jax import cli
from bert_jax.tasks import pairs


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("configs/pairs.py and overrides (the model's shape, "
                    "the batch, the buckets).", argv=argv, **define)
  flags.DEFINE_integer("chunk", 0, "train.cache_chunk_size: 0 = the plain "
                       "step.", **define)


FLAGS = flags.FLAGS


def main(argv):
  del argv
  m = benchmarking.train_step_memory(FLAGS.config, FLAGS.chunk)
  c = FLAGS.config
  print(f"pairs train step, batch {c.train.batch_size} x "
        f"{pairs.texts_per_example(c)} texts of "
        f"{max(c.task.buckets or (c.data.seq_length,))} tokens, chunk "
        f"{FLAGS.chunk}: peak {m['peak_mb']:,.0f} MB, temporaries "
        f"{m['temporaries_mb']:,.0f} MB")


if __name__ == "__main__":
  cli.run(main, define_flags)
