r"""Compile the BERT train step for TPU topologies, with no TPU, and print memory.

Needs libtpu (``pip install -r requirements-tpu.txt``, 684 MB); the compile
runs on this machine's CPU against a described TPU topology. For every
(config, topology, mesh) it lowers and compiles the real jitted
``steps_lib.Programs`` step (same shardings, donation and optimizer as training)
and prints XLA's per-device memory analysis: arguments (state + batch),
temporaries, outputs, plus the parameter + optimizer bytes each device holds
according to the state shardings.

  python tools/tpu_compile_check.py                      # base+large, v5e:2x2 + v4:2x2x1, dp+fsdp
  python tools/tpu_compile_check.py --configs configs/base.py \
      --topologies v5e:2x2 --meshes dp,fsdp,tp2 --batch_size 64

  python tools/tpu_compile_check.py --configs configs/base.py \
      --topologies v5e:2x2 --meshes fsdp --seq_length 512 --attention splash

`--attention` sets model.attention_impl ("splash": the TPU Pallas flash
kernel); the fused kinds have no attention dropout, so it also sets
model.attention_probs_dropout_prob=0 for them. `--variants` compiles several
(seq_length, attention, max_predictions) per mesh in one call, e.g. the
table of docs/scaling-and-tpu.md (18 rows, minutes each; `--output` appends
every row to a JSON-lines file as soon as it compiles, and skips rows
already there, so the job can run in the background and be restarted;
`--table FILE` prints the table):

  nohup python tools/tpu_compile_check.py --dtype bfloat16 \
      --configs configs/base.py --topologies v5e:2x2 --meshes dp,fsdp,tp2 \
      --variants 128:xla:20,512:xla:80,512:splash:80 --output rows.jsonl &
  python tools/tpu_compile_check.py --table rows.jsonl

A step that does not fit the chip's HBM is a row too: XLA's compile fails
with RESOURCE_EXHAUSTED, and the row keeps the state's bytes, the
temporaries XLA asked for, and "OOM: needed > available GiB" as its bound.

Besides memory, each row has XLA's own cost analysis of the compiled step
(FLOPs and HBM bytes accessed per chip) turned into a roofline bound: the
step takes at least max(FLOPs / peak, bytes / HBM bandwidth) on that chip,
and "MFU bound" is the model FLOPs (`bert_jax.models.flops`, matmuls only) over
that time at peak: no real step does better. "XLA/model" compares XLA's FLOP
count (all ops, optimizer included) with the analytic count; Pallas kernels
are custom calls whose FLOPs XLA does not see (splash rows count less).

Meshes: dp (data=-1), fsdp (fsdp=-1), tpN (tensor=N, data=-1), or any
``data.fsdp.tensor`` triple such as ``1.2.2``.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time

from absl import flags

MB = 2 ** 20
COLUMNS = ("config", "topology", "mesh", "seq", "attention", "chips",
           "params+opt/chip MB", "replicated MB", "ratio", "arguments MB",
           "temporaries MB", "outputs MB", "XLA TFLOP/chip", "XLA/model",
           "HBM GB/chip", "roofline ms", "bound", "MFU bound", "compile s")
# Columns from the first version of the tool (rows without a cost analysis).
MEMORY_COLUMNS = COLUMNS[:12] + ("compile s",)

# Per chip: (dense bf16 TFLOP/s, HBM GB/s), Cloud TPU spec sheets.
CHIP_SPECS = {
    "v4": (275.0, 1228.0),
    "v5e": (197.0, 819.0),
    "v5p": (459.0, 2765.0),
    "v6e": (918.0, 1640.0),
}


def roofline(topology: str, flops_per_chip: float, bytes_per_chip: float,
             model_flops_per_chip: float) -> dict:
  """Lower bound on step time from XLA's counts, and the MFU it allows."""
  peak, bandwidth = CHIP_SPECS[topology.split(":")[0]]
  compute_s = flops_per_chip / (peak * 1e12)
  memory_s = bytes_per_chip / (bandwidth * 1e9)
  bound_s = max(compute_s, memory_s)
  return {
      "roofline ms": 1e3 * bound_s,
      "bound": "compute" if compute_s >= memory_s else "HBM",
      "MFU bound": model_flops_per_chip / (bound_s * peak * 1e12),
  }


def parse_variants(spec: str) -> list[tuple[int | None, str | None, int | None]]:
  """"128:xla:20,512:splash:80" -> [(seq, attention, max_predictions)]."""
  out = []
  for item in filter(None, spec.split(",")):
    parts = item.split(":")
    if not 1 <= len(parts) <= 3 or not parts[0].isdigit():
      raise ValueError(f"--variants: {item!r} is not SEQ[:ATTENTION[:PREDICTIONS]]"
                       " (e.g. 512:splash:80).")
    seq = int(parts[0])
    attention = parts[1] if len(parts) > 1 and parts[1] else None
    predictions = int(parts[2]) if len(parts) > 2 else None
    out.append((seq, attention, predictions))
  return out


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


def build_config(config_path: str, mesh_name: str, batch_size: int | None,
                 seq_length: int | None, attention: str | None = None,
                 max_predictions: int | None = None, dtype: str | None = None):
  """The config file with this row's mesh, shapes, attention and dtype."""
  config = _load_config(config_path)
  config.mesh.update(mesh_overrides(mesh_name))
  if batch_size:
    config.train.batch_size = batch_size
  if seq_length:
    config.data.seq_length = seq_length
  if max_predictions:
    config.data.max_predictions_per_seq = max_predictions
  if dtype:
    config.model.dtype = dtype
  if attention:
    config.model.attention_impl = attention
    if attention != "xla":  # The fused kernels have no attention dropout.
      config.model.attention_probs_dropout_prob = 0.0
  return config


def row_key(config_path: str, topology: str, mesh_name: str, config) -> tuple:
  """What a row is compiled for; known before compiling (restarts skip it)."""
  return (os.path.splitext(os.path.basename(config_path))[0], topology,
          mesh_name, config.data.seq_length, config.model.attention_impl,
          config.model.dtype, config.train.batch_size,
          config.data.max_predictions_per_seq)


def check(config_path: str, topology: str, mesh_name: str, config) -> dict:
  from bert_jax import compose
  from bert_jax.training import compiled as compiled_lib
  from bert_jax.training import config_checks
  from bert_jax.training import sharding
  from bert_jax.training import steps as steps_lib

  devices = topology_devices(topology)
  config_checks.validate(config, len(devices), check_sources=False)
  mesh = sharding.make_mesh(config.mesh, devices)
  programs = steps_lib.Programs(config, mesh)
  per_device, total = state_bytes(programs.abstract_state)
  start = time.time()
  try:
    with programs.context():
      compiled = compiled_lib.compile_ahead(
          programs.train_step, programs.abstract_state,
          programs.batch_spec(config.train.batch_size))
  except Exception as e:  # pylint: disable=broad-except
    oom = out_of_memory(str(e))
    if oom is None:
      raise
    # The answer to "will it fit?" is no: a row that says by how much.
    row = {c: "-" for c in COLUMNS}
    row.update(
        config=os.path.splitext(os.path.basename(config_path))[0],
        topology=topology, mesh=sharding.describe(mesh),
        seq=config.data.seq_length, attention=config.model.attention_impl,
        chips=len(devices), **{"params+opt/chip MB": per_device / MB,
                               "replicated MB": total / MB,
                               "ratio": per_device / total,
                               "temporaries MB": oom[0]},
        bound=f"OOM: {oom[0] / 1024:.1f} > {oom[1] / 1024:.2f} GiB",
        **{"compile s": time.time() - start}, fits=False,
        dtype=config.model.dtype, batch=config.train.batch_size,
        predictions=config.data.max_predictions_per_seq,
        key=list(row_key(config_path, topology, mesh_name, config)))
    return row
  mem, cost = compiled.memory, compiled.cost
  xla_flops, hbm_bytes = cost.flops, cost.bytes_accessed
  model_flops = compose.train_flops_per_step(config) / len(devices)
  return {
      "config": os.path.splitext(os.path.basename(config_path))[0],
      "topology": topology,
      "mesh": sharding.describe(mesh),
      "seq": config.data.seq_length,
      "attention": config.model.attention_impl,
      "chips": len(devices),
      "params+opt/chip MB": per_device / MB,
      "replicated MB": total / MB,
      "ratio": per_device / total,
      "arguments MB": mem.arguments / MB,
      "temporaries MB": mem.temporaries / MB,
      "outputs MB": mem.outputs / MB,
      "XLA TFLOP/chip": xla_flops / 1e12,
      "XLA/model": xla_flops / model_flops,
      "HBM GB/chip": hbm_bytes / 1e9,
      **roofline(topology, xla_flops, hbm_bytes, model_flops),
      "compile s": compiled.seconds,
      "dtype": config.model.dtype,
      "batch": config.train.batch_size,
      "predictions": config.data.max_predictions_per_seq,
      "key": list(row_key(config_path, topology, mesh_name, config)),
  }


def out_of_memory(message: str) -> tuple[float, float] | None:
  """(MiB XLA needs for temporaries, MiB of HBM a chip has) from the
  RESOURCE_EXHAUSTED error of a compile that does not fit, else None."""
  m = re.search(r"HLO temporaries \(([\d.]+)([MG])\) exceeds available HBM "
                r"\(([\d.]+)([MG])\)", message)
  if "RESOURCE_EXHAUSTED" not in message or m is None:
    return None
  mib = lambda value, unit: float(value) * (1024 if unit == "G" else 1)
  return mib(m.group(1), m.group(2)), mib(m.group(3), m.group(4))


def read_rows(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _load_config(path: str):
  import importlib.util
  spec = importlib.util.spec_from_file_location("_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def format_table(rows: list[dict]) -> str:
  """A Markdown table, one row per compiled step."""
  columns = (COLUMNS if all(c in r for r in rows for c in COLUMNS)
             else MEMORY_COLUMNS)
  def cell(v):
    if isinstance(v, float):
      return f"{v:.3f}" if v < 10 else f"{v:,.1f}"
    return str(v)
  cells = [[cell(r[c]) for c in columns] for r in rows]
  widths = [max(len(c), *(len(row[i]) for row in cells))
            for i, c in enumerate(columns)]
  line = lambda vals: "| " + " | ".join(
      v.rjust(w) if i >= 5 else v.ljust(w)
      for i, (v, w) in enumerate(zip(vals, widths))) + " |"
  sep = "|" + "|".join(("-" * (w + 1) + ":" if i >= 5 else "-" * (w + 2))
                       for i, w in enumerate(widths)) + "|"
  return "\n".join([line(columns), sep] + [line(r) for r in cells])


def define_flags(flag_values, argv=None) -> None:
  del argv  # --configs, not --config: several config files.
  from bert_jax import cli  # pylint: disable=g-import-not-at-top  (see main)
  define = dict(flag_values=flag_values)
  flags.DEFINE_string("configs", "configs/base.py,configs/large.py",
                      "Config files, comma-separated.", **define)
  flags.DEFINE_string("topologies", "v5e:2x2,v4:2x2x1", "TPU topologies.",
                      **define)
  flags.DEFINE_string("meshes", "dp,fsdp", "dp, fsdp, tpN or "
                      "data.fsdp.tensor, comma-separated.", **define)
  flags.DEFINE_integer("batch_size", None, "Global batch (default: the "
                       "config's).", **define)
  flags.DEFINE_integer("seq_length", None, "data.seq_length (default: the "
                       "config's).", **define)
  flags.DEFINE_string("attention", None, "model.attention_impl: xla "
                      "(default: the config's), dot_product_attention or "
                      "splash.", **define)
  flags.DEFINE_string("variants", "", "SEQ[:ATTENTION[:PREDICTIONS]],... "
                      "compiled for every mesh (instead of --seq_length / "
                      "--attention).", **define)
  flags.DEFINE_string("dtype", None, "model.dtype (compute), e.g. bfloat16 "
                      "as on TPU.", **define)
  cli.define_output("Append each row to this JSON-lines file as it compiles; "
                    "rows already in it are skipped.", default="",
                    aliases=("out",), **define)
  flags.DEFINE_string("table", "", "Only print the table of an --output "
                      "file.", **define)


def main(argv=None) -> int:
  # Before jax is imported (bert_jax.cli imports it): host side on CPU;
  # without the TPU_* variables libtpu looks for TPU metadata of a GCE VM
  # and complains.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-4")
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  from bert_jax import cli  # pylint: disable=g-import-not-at-top  (after the environment)
  args, _ = cli.parse(argv, define_flags, __doc__)
  if args.table:
    print(format_table(read_rows(args.table)))
    return 0
  try:
    variants = (parse_variants(args.variants) if args.variants else
                [(args.seq_length, args.attention, None)])
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  try:
    import libtpu  # noqa: F401
  except ImportError:
    print("error: libtpu is not installed; pip install -r "
          "requirements-tpu.txt (684 MB) to compile for TPU without one.",
          file=sys.stderr)
    return 2
  old = read_rows(args.output) if args.output else []
  done = {tuple(r["key"]): r for r in old if "key" in r}
  rows = []
  for config_path in args.configs.split(","):
    for topology in args.topologies.split(","):
      for mesh_name in args.meshes.split(","):
        for seq, attention, predictions in variants:
          config = build_config(config_path, mesh_name, args.batch_size, seq,
                                attention, predictions, args.dtype)
          key = row_key(config_path, topology, mesh_name, config)
          if key in done:
            print(f"already in {args.output}: {key}", file=sys.stderr)
            rows.append(done[key])
            continue
          row = check(config_path, topology, mesh_name, config)
          print(f"{'compiled' if row.get('fits', True) else 'does not fit:'}"
                f" {row['config']} on {topology} ({row['mesh']}, seq "
                f"{row['seq']}, {row['attention']}) in {row['compile s']:.1f}s"
                f"{'' if row.get('fits', True) else ' (' + row['bound'] + ')'}",
                file=sys.stderr, flush=True)
          rows.append(row)
          if args.output:
            with open(args.output, "a") as f:
              f.write(json.dumps(row) + "\n")
  print(format_table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())
