"""In-batch negatives are the whole global batch, on any mesh.

The pairs kind's train step (InfoNCE with a hard negative, and CoSENT) on
the same batches gives the same per-step loss on 1 device and on 8
simulated CPU devices (data parallel 8, FSDP 8, DP 4 x TP 2); the cached-
gradient step too, and the batches' texts packed into rows (data.packing:
a text's vector gathered from whichever device holds its row; chunk by
chunk for the cached step). A deliberately per-device InfoNCE (each device's
anchors against its own rows only, ``shard_map``) trains to other losses,
which the comparison tells apart. Run as a script, this file is the
8-device child.
"""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from tests.helpers.pairs import packed
from tests.helpers.pairs import pairs_batch
from tests.helpers.pairs import pairs_config

MESHES = {"single": (1, 1, 1), "dp8": (8, 1, 1), "fsdp8": (1, 8, 1),
          "dp4_tp2": (4, 1, 2)}
PACKED_MESHES = ("dp8", "fsdp8")
STEPS = 3
TOLERANCE = 1e-5


def per_device_objective(objective, mesh, config):
  """The objective with InfoNCE over each device's own rows (psum of the
  per-device sums): what a loss that forgets the global batch computes."""
  import jax
  from jax.sharding import PartitionSpec as P

  from bert_jax.tasks import pair_losses
  from bert_jax.tasks import pairs

  def loss_sums(model, batch, rng, deterministic, config_):
    vectors = pairs.embed(model, batch, rng, deterministic, config_)

    def local(v, w, ids):
      total, count = pair_losses.info_nce(
          v, w, ids, scale=float(config.objective.pair_scale))
      return (jax.lax.psum(total, ("data", "fsdp")),
              jax.lax.psum(count, ("data", "fsdp")))

    batch_axes = P(("data", "fsdp"))
    total, count = jax.shard_map(
        local, mesh=mesh, in_specs=(batch_axes,) * 3, out_specs=(P(), P()),
        check_vma=False)(vectors, batch["example_weights"],
                         batch["text_ids"])
    return dict(loss=total, count=count)

  return dataclasses.replace(objective, loss_sums=loss_sums, split=None)


def _losses(config, mesh, objective=None):
  import jax

  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib
  programs = steps_lib.Programs(config, mesh, objective)
  out = []
  with programs.context():
    state = programs.init()
    for step in range(STEPS):
      batch = pairs_batch(step)
      if config.data.packing:
        chunk = config.train.cache_chunk_size
        batch = packed(batch, config.train.batch_size // chunk if chunk
                       else 1)
      batch = sharding.global_batch(batch, programs.batch_sharding)
      state, metrics = programs.train_step(state, batch)
      out.append(float(jax.device_get(metrics["loss"])))
  return out


def _child(out_path: str) -> None:
  import jax
  import numpy as np

  from bert_jax import compose
  from bert_jax.training import sharding
  assert jax.device_count() == 8, jax.devices()
  out = {}
  for loss in ("infonce", "cosent"):
    for name, shape in MESHES.items():
      config = pairs_config(loss, *shape)
      mesh = sharding.make_mesh(config.mesh,
                                jax.devices()[:int(np.prod(shape))])
      out[f"{loss}/{name}"] = _losses(config, mesh)
  config = pairs_config("infonce", 8, chunk=8)
  mesh = sharding.make_mesh(config.mesh, jax.devices())
  out["infonce/dp8_cached"] = _losses(config, mesh)
  for name in PACKED_MESHES:
    config = pairs_config("infonce", *MESHES[name], packing=True)
    mesh = sharding.make_mesh(config.mesh, jax.devices())
    out[f"infonce/{name}_packed"] = _losses(config, mesh)
  config = pairs_config("infonce", 8, chunk=8, packing=True)
  mesh = sharding.make_mesh(config.mesh, jax.devices())
  out["infonce/dp8_cached_packed"] = _losses(config, mesh)
  config = pairs_config("infonce", 8)
  mesh = sharding.make_mesh(config.mesh, jax.devices())
  out["infonce/dp8_per_device"] = _losses(
      config, mesh, per_device_objective(compose.objective(config), mesh,
                                         config))
  with open(out_path, "w") as f:
    json.dump(out, f)


@pytest.mark.slow
def test_global_negatives_give_one_loss_on_any_mesh(tmp_path):
  from tests import helpers
  out = str(tmp_path / "losses.json")
  proc = subprocess.run([sys.executable, os.path.abspath(__file__), out],
                        env=helpers.child_env(devices=8), cwd=helpers.REPO,
                        capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-5000:]
  with open(out) as f:
    losses = json.load(f)
  rel = lambda a, b: max(abs(x - y) / abs(y) for x, y in zip(a, b))
  for loss in ("infonce", "cosent"):
    single = losses[f"{loss}/single"]
    assert len(single) == STEPS and single[0] > 0
    for name in MESHES:
      assert rel(losses[f"{loss}/{name}"], single) < TOLERANCE, (
          loss, name, losses)
  assert rel(losses["infonce/dp8_cached"], losses["infonce/single"]) < (
      TOLERANCE), losses
  for name in PACKED_MESHES + ("dp8_cached",):
    assert rel(losses[f"infonce/{name}_packed"], losses["infonce/single"]) < (
        TOLERANCE), (name, losses)
  # Each device's 2 anchors against 2 x 2 candidates, not 16 x 2: another
  # loss from the first step on.
  assert rel(losses["infonce/dp8_per_device"], losses["infonce/single"]) > (
      0.1), losses


if __name__ == "__main__":
  _child(sys.argv[1])
