"""Fine-tune a checkpoint on a downstream task and evaluate it.

  python -m bert_jax.finetune --config configs/finetune.py \
      --config.task.name=glue/sst2 --config.task.tfds_data_dir=DIR \
      --config.train.init_from=PRETRAIN_WORKDIR --workdir OUT

`train.init_from` is anything `bert_jax.pretrained` resolves: a pretraining
workdir (latest step, or `--config.train.init_from_step`), a step directory,
an imported directory, a Hugging Face BERT directory or a Google TF
checkpoint. The encoder comes from there, the classifier is new. Training is
the pretraining `Trainer` (same mesh, sharding rules, optimizer, Orbax
checkpoints and exact resume) with the `classify` objective and the task's
bucketed batches; evaluation runs over every validation example and writes
the task's official metrics to `OUT/results.json`, TensorBoard and a table.
A run stopped by SIGTERM (or Ctrl-C) commits a checkpoint and exits 0 with
no results.json, as a preempted pretraining run does: rerun to finish.

`--sweep_learning_rates=2e-5,3e-5,5e-5 --sweep_seeds=0,1,2` runs one
fine-tuning per pair under OUT/lr<lr>-seed<seed>/ and reports, per task, the
median over seeds of the best learning rate (`OUT/sweep.json`).
"""

from absl import flags

from bert_jax import cli
from bert_jax.downstream import finetuning

cli.define_job_flags()
flags.DEFINE_list("sweep_learning_rates", [], "e.g. 2e-5,3e-5,5e-5")
flags.DEFINE_list("sweep_seeds", [], "e.g. 0,1,2")
FLAGS = cli.FLAGS


def main(argv):
  del argv
  cli.setup()
  config, workdir = FLAGS.config, FLAGS.workdir
  if FLAGS.sweep_learning_rates or FLAGS.sweep_seeds:
    lrs = [float(x) for x in FLAGS.sweep_learning_rates] or [
        config.train.learning_rate]
    seeds = [int(x) for x in FLAGS.sweep_seeds] or [config.train.seed]
    result = cli.call(lambda: finetuning.sweep(config, workdir, lrs, seeds))
  else:
    result = cli.call(lambda: finetuning.run(
        config, workdir, take_over_workdir=FLAGS.take_over_workdir))
  if "preempted_at_step" in result:  # SIGTERM: as a preempted pretraining.
    print(f"preempted at step {result['preempted_at_step']}: checkpoint "
          "saved, no results yet; run the same command to resume.")


if __name__ == "__main__":
  cli.run(main)
