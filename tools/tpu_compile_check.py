r"""Compile the BERT train step for TPU topologies, with no TPU, and print memory.

Needs libtpu (``pip install -r requirements-tpu.txt``, 684 MB); the compile
runs on this machine's CPU against a described TPU topology. For every
(config, topology, mesh) it lowers and compiles the real jitted
``train.Programs`` step (same shardings, donation and optimizer as training)
and prints XLA's per-device memory analysis: arguments (state + batch),
temporaries, outputs, plus the parameter + optimizer bytes each device holds
according to the state shardings.

  python tools/tpu_compile_check.py                      # base+large, v5e:2x2 + v4:2x2x1, dp+fsdp
  python tools/tpu_compile_check.py --configs configs/base.py \
      --topologies v5e:2x2 --meshes dp,fsdp,tp2 --batch_size 64

Meshes: dp (data=-1), fsdp (fsdp=-1), tpN (tensor=N, data=-1), or any
``data.fsdp.tensor`` triple such as ``1.2.2``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

MB = 2 ** 20
COLUMNS = ("config", "topology", "mesh", "chips", "params+opt/chip MB",
           "replicated MB", "ratio", "arguments MB", "temporaries MB",
           "outputs MB", "compile s")


def mesh_overrides(name: str) -> dict:
  if name == "dp":
    return dict(data=-1, fsdp=1, tensor=1)
  if name == "fsdp":
    return dict(data=1, fsdp=-1, tensor=1)
  if name.startswith("tp"):
    return dict(data=-1, fsdp=1, tensor=int(name[2:]))
  parts = name.split(".")
  if len(parts) == 3:
    return dict(zip(("data", "fsdp", "tensor"), map(int, parts)))
  raise ValueError(f"--meshes: unknown mesh {name!r} (dp, fsdp, tpN or "
                   "data.fsdp.tensor).")


def state_bytes(abstract_state) -> tuple[int, int]:
  """(bytes per device, bytes replicated) of params + optimizer state."""
  import jax
  per_device = total = 0
  for leaf in jax.tree.leaves((abstract_state["params"],
                               abstract_state["opt_state"])):
    itemsize = leaf.dtype.itemsize
    total += math.prod(leaf.shape) * itemsize
    per_device += math.prod(leaf.sharding.shard_shape(leaf.shape)) * itemsize
  return per_device, total


# Chips with two TensorCores that JAX drives as one device ("megacore"), as
# on a real Cloud TPU VM; the topology default is one device per core, which
# jax.make_mesh rejects for these generations.
MEGACORE = ("v4", "v5p")


def topology_options(topology: str) -> dict:
  generation = topology.split(":")[0]
  return dict(chip_config_name="megacore") if generation in MEGACORE else {}


def topology_devices(topology: str) -> list:
  from jax.experimental import topologies
  return topologies.get_topology_desc(
      topology_name=topology, platform="tpu",
      **topology_options(topology)).devices


def check(config_path: str, topology: str, mesh_name: str,
          batch_size: int | None, seq_length: int | None) -> dict:
  from bert_jax import config_checks
  from bert_jax import sharding
  from bert_jax import train

  config = _load_config(config_path)
  config.mesh.update(mesh_overrides(mesh_name))
  if batch_size:
    config.train.batch_size = batch_size
  if seq_length:
    config.data.seq_length = seq_length
  devices = topology_devices(topology)
  config_checks.validate(config, len(devices), check_sources=False)
  mesh = sharding.make_mesh(config.mesh, devices)
  programs = train.Programs(config, mesh)
  start = time.time()
  with programs.context():
    compiled = programs.train_step.lower(
        programs.abstract_state,
        programs.batch_spec(config.train.batch_size)).compile()
  seconds = time.time() - start
  mem = compiled.memory_analysis()
  per_device, total = state_bytes(programs.abstract_state)
  return {
      "config": os.path.splitext(os.path.basename(config_path))[0],
      "topology": topology,
      "mesh": sharding.describe(mesh),
      "chips": len(devices),
      "params+opt/chip MB": per_device / MB,
      "replicated MB": total / MB,
      "ratio": per_device / total,
      "arguments MB": mem.argument_size_in_bytes / MB,
      "temporaries MB": mem.temp_size_in_bytes / MB,
      "outputs MB": mem.output_size_in_bytes / MB,
      "compile s": seconds,
  }


def _load_config(path: str):
  import importlib.util
  spec = importlib.util.spec_from_file_location("_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def format_table(rows: list[dict]) -> str:
  """A Markdown table, one row per compiled step."""
  def cell(v):
    if isinstance(v, float):
      return f"{v:.3f}" if v < 10 else f"{v:,.1f}"
    return str(v)
  cells = [[cell(r[c]) for c in COLUMNS] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells))
            for i, c in enumerate(COLUMNS)]
  line = lambda vals: "| " + " | ".join(
      v.rjust(w) if i >= 3 else v.ljust(w)
      for i, (v, w) in enumerate(zip(vals, widths))) + " |"
  sep = "|" + "|".join(("-" * (w + 1) + ":" if i >= 3 else "-" * (w + 2))
                       for i, w in enumerate(widths)) + "|"
  return "\n".join([line(COLUMNS), sep] + [line(r) for r in cells])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--configs", default="configs/base.py,configs/large.py")
  parser.add_argument("--topologies", default="v5e:2x2,v4:2x2x1")
  parser.add_argument("--meshes", default="dp,fsdp")
  parser.add_argument("--batch_size", type=int, default=None,
                      help="Global batch (default: the config's).")
  parser.add_argument("--seq_length", type=int, default=None)
  args = parser.parse_args(argv)
  # Before jax is imported: host side on CPU; without the TPU_* variables
  # libtpu looks for TPU metadata of a GCE VM and complains.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  try:
    import libtpu  # noqa: F401
  except ImportError:
    print("error: libtpu is not installed; pip install -r "
          "requirements-tpu.txt (684 MB) to compile for TPU without one.",
          file=sys.stderr)
    return 2
  rows = []
  for config_path in args.configs.split(","):
    for topology in args.topologies.split(","):
      for mesh_name in args.meshes.split(","):
        row = check(config_path, topology, mesh_name, args.batch_size,
                    args.seq_length)
        print(f"compiled {row['config']} on {topology} ({row['mesh']}) in "
              f"{row['compile s']:.1f}s", file=sys.stderr, flush=True)
        rows.append(row)
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
