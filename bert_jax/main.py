"""Entry point: ``python -m bert_jax.main --config configs/demo.py --workdir DIR``.

Overrides: ``--config.train.num_steps=20``. Multi-host: on Cloud TPU VMs
``jax.distributed`` initializes from the environment
(``--distributed=auto``); elsewhere pass ``--coordinator_address``,
``--num_processes`` and ``--process_id``.
"""

import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

config_flags.DEFINE_config_file(
    "config", None, "Path to a config file in configs/.", lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics and TensorBoard.")
flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                  "auto: initialize jax.distributed when the environment or "
                  "the flags below describe several processes.")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Total number of processes.")
flags.DEFINE_integer("process_id", None, "Index of this process.")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS

# Environment variables set on Cloud TPU VM slices and by SLURM/MPI launchers.
_MULTIHOST_ENV = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS",
                  "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def _wants_distributed() -> bool:
  if FLAGS.distributed == "off":
    return False
  if FLAGS.distributed == "on" or FLAGS.coordinator_address:
    return True
  hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if "," in hosts:
    return True
  return any(int(os.environ.get(v, "1") or 1) > 1
             for v in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"))


def initialize_distributed() -> None:
  import jax
  if not _wants_distributed():
    return
  kwargs = {}
  if FLAGS.coordinator_address:
    kwargs = dict(coordinator_address=FLAGS.coordinator_address,
                  num_processes=FLAGS.num_processes,
                  process_id=FLAGS.process_id)
  try:
    jax.distributed.initialize(**kwargs)
  except Exception as e:  # Surface one line naming what failed.
    raise RuntimeError(
        f"jax.distributed.initialize({kwargs or 'from environment'}) failed: "
        f"{e}") from e
  logging.info("Process %d of %d; %d local / %d global devices.",
               jax.process_index(), jax.process_count(),
               jax.local_device_count(), jax.device_count())


class _QuietLibraries:
  """Drop INFO chatter of Orbax and absl internals; keep their warnings."""

  def filter(self, record) -> bool:
    return record.levelno >= 30 or "/orbax/" not in record.pathname


def main(argv):
  del argv
  logging.get_absl_handler().addFilter(_QuietLibraries())
  initialize_distributed()
  from bert_jax import train  # After distributed init: jax backends start here.
  try:
    metrics = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    logging.error("%s", e)
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
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
  app.run(main)
