"""Entry point: ``python -m bert_jax.main --config configs/demo.py --workdir DIR``.

Overrides: ``--config.train.num_steps=20``. Multi-host: on Cloud TPU VMs
``jax.distributed`` initializes from the environment
(``--distributed=auto``); elsewhere pass ``--coordinator_address``,
``--num_processes`` and ``--process_id``.
"""

import sys

from bert_jax import cli
from bert_jax.training import trainer as trainer_lib

cli.define_job_flags()
FLAGS = cli.FLAGS


def main(argv):
  del argv
  cli.setup()
  # The fields set on the command line: train.init_from's config decides
  # the others' architecture (start_from.adopt_architecture).
  overrides = {a[len("--config."):].split("=")[0] for a in sys.argv[1:]
               if a.startswith("--config.")}
  metrics = cli.call(lambda: trainer_lib.train_and_evaluate(
      FLAGS.config, FLAGS.workdir, take_over_workdir=FLAGS.take_over_workdir,
      overrides=overrides))
  if "preempted_at_step" in metrics:  # SIGTERM: checkpoint committed; exit 0.
    print(f"preempted at step {metrics['preempted_at_step']}: checkpoint "
          "saved; run the same command to resume.")
    return
  baseline = metrics.get("eval_unigram_accuracy")
  if "eval_mlm_accuracy" in metrics:
    line = f"final held-out MLM accuracy {metrics['eval_mlm_accuracy']:.4f}"
    if baseline is not None:
      line += f" (unigram baseline {baseline:.4f})"
    print(line)


if __name__ == "__main__":
  cli.run(main)
