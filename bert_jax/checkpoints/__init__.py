"""Checkpoints: Orbax manager, fit checks, one writer per workdir.

  manager.py        the Orbax CheckpointManager (async saves, iterator state,
                    quarantine of damaged steps, mesh-free param loading)
  reading.py        committed steps, a step's config and metadata, params as
                    numpy or onto given shardings, with no Checkpointer
  orbax_reads.py    restores whose failed reads leave no pending task for the
                    garbage collector to print later
  checks.py         does a checkpoint fit this model / mesh (messages that
                    name the parameter and both configs)
  workdir_lock.py   one writer per workdir (flock locally, an identity
                    object on gs://)

May import: ``config_lib``. Nothing of training, downstream or the models.
"""
