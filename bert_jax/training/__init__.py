"""Training: the mesh, the jitted steps, the optimizer and the loop.

  steps.py              sharded train state; pure train / eval / predict
                        steps of any objective; ``Programs`` (them jitted on
                        a mesh, everything they need derived once)
  trainer.py            the loop (``Trainer``) and the pretraining job
  compiled.py           ahead-of-time compiling of a step; XLA's memory and
                        cost analyses of it
  config_checks.py      every check of a run's config, before anything is
                        written
  start_from.py         what a new run's params start from (train.init_from,
                        a teacher) and so which tokenizer it uses
  pretraining_input.py  a pretraining run's tokenizer, train iterator (per
                        phase) and eval batches
  sharding.py           mesh from config, logical-axis rules, shardings
  optim.py              AdamW / LAMB, schedule, clipping, decay mask; the
                        rate an update applies, read from the optimizer
  phases.py             the phases of one run (128 -> 512 tokens)
  preemption.py         SIGTERM / SIGINT saves, the non-finite policy
  metrics_writer.py     metrics.jsonl and TensorBoard
  utilization.py        peak TFLOP/s per device and MFU

May import: ``models``, ``data``, ``checkpoints``, ``hf``, ``pretrained``,
``objectives``. Never downstream or an entry point.
"""
