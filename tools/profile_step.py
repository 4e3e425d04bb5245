r"""Where a train step's time goes: per part of the model and per pass.

  python tools/profile_step.py --config configs/modernbert_base.py \
      --config.model.num_hidden_layers=6 --config.data.seq_length=512 \
      --config.data.max_predictions_per_seq=77 --config.train.batch_size=4 \
      [--steps 3 --rounds 1 --warmup 1] [--top 15] [--json FILE] \
      [--trace_dir DIR]

Compiles the config's train step ahead of time (the trainer's step, on the
synthetic batches of tools/benchmark.py), times `--rounds` x `--steps`
steps (`bert_jax.benchmarking`), then runs `--steps` more under
``jax.profiler.trace`` and reads the trace: XLA runs the compiled step as a
sequence of HLO instructions (fusions, dots, copies), each a trace event
named after its instruction. Every instruction of the optimized HLO carries
the Python stack that built it (``compiled.as_text()``: op_name and stack
frames); the part of the model it belongs to is the innermost frame that
names one:

  attention: sliding window   `attention._blocked_attend` (local layers)
  attention: full             `attention.attend` (global layers; BERT's)
  attention: projections      the QKV and output matmuls, rotary positions
  MLP                         GeGLU (ModernBERT), FeedForward (BERT)
  MLM head                    gather of the masked positions, dense, norm,
                              decoder
  MLM loss                    softmax cross-entropy
  embeddings, layer norms, optimizer (optax: AdamW, clipping), metrics

With --task, the step is the fine-tuning run's on its task's own batches
(the task and checkpoint the config names, packed rows with
--config.data.packing=True; train.batch_size counts rows then):

  python tools/profile_step.py --config configs/finetune.py --task \
      --config.task.name=stsb1 --config.task.text_field=text \
      --config.task.train_file=train.csv \
      --config.task.validation_file=dev.csv \
      --config.train.init_from=MODEL --config.data.seq_length=64 \
      --config.data.packing=True --config.train.batch_size=7

and the pass is backward where the op is a transpose of the forward
(op_name ``transpose(jvp(...))``). Per part and pass it prints the time per
step, its share of the op time, the matmul FLOPs of its dot instructions
(2 x output size x contracted size, from the HLO shapes) and the GFLOP/s
they ran at: a part whose share of time is far above its share of FLOPs
is where the step loses time to memory traffic or overhead rather than to
arithmetic. Then the `--top` instructions. On CPU, XLA may run independent
instructions at the same time: the op time can exceed the wall time, and
the shares are of the op time.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import math
import os
import re
import tempfile

import jax
from absl import flags

from bert_jax import benchmarking
from bert_jax import cli

FLAGS = flags.FLAGS


def define_flags(flag_values, argv=None) -> None:
  """Defined only when run as a script, so tests can import this module."""
  define = dict(flag_values=flag_values)
  cli.define_config("Config file (configs/*.py) and overrides.", argv=argv,
                    lock_config=False, **define)
  cli.define_timing(rounds=1, steps_help="Timed steps per round, then "
                    "steps traced.", **define)
  flags.DEFINE_integer("top", 15, "Instructions listed by time.", **define)
  flags.DEFINE_string("json", "", "Also write the breakdown to this file.",
                      **define)
  flags.DEFINE_string("trace_dir", "", "Keep the profiler trace here (for "
                      "TensorBoard / Perfetto); default: a temporary one.",
                      **define)
  flags.DEFINE_bool("task", False, "Profile the fine-tuning step on the "
                    "task's own training batches (config.task.*, "
                    "config.train.init_from; data.packing: packed rows) "
                    "instead of synthetic pretraining batches.", **define)


# ==============================================================================
# The optimized HLO: instructions, shapes, FLOPs, Python stacks.
# ==============================================================================
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<type>\S+?\[[^\]]*\])"
    r"(?:\{[^}]*\})?\s+(?P<opcode>[\w\-]+)\((?P<operands>[^)]*)\)"
    r"(?P<attrs>.*)$")
_TUPLE_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*\((?P<type>.*?)\)\s+"
    r"(?P<opcode>[\w\-]+)\((?P<operands>[^)]*)\)(?P<attrs>.*)$")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s*\(")
_DIMS = re.compile(r"\[([\d,]*)\]")


def _dims(type_text: str) -> tuple[int, ...]:
  m = _DIMS.search(type_text)
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def _ids(attrs: str, key: str) -> tuple[int, ...]:
  m = re.search(key + r"=\{([\d,]*)\}", attrs)
  return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


def _table(lines: list[str]) -> dict[int, str]:
  return {int(l.split(None, 1)[0]): l.split(None, 1)[1] for l in lines}


class Hlo:
  """The instructions of an optimized HLO module (``compiled.as_text()``)
  with their shapes, dot FLOPs, fused computations and Python stacks."""

  def __init__(self, text: str):
    self.instructions: dict[str, dict] = {}
    self.computations: dict[str, list[str]] = {}
    sections = {}
    computation = None
    for block in text.split("\n\n"):
      lines = block.strip().splitlines()
      if lines and lines[0] in ("FileNames", "FunctionNames",
                                "FileLocations", "StackFrames"):
        sections[lines[0]] = _table(lines[1:])
        continue
      for line in lines:
        m = _COMPUTATION.match(line)
        if m and line.rstrip().endswith("{"):
          computation = m.group("name")
          self.computations[computation] = []
          continue
        m = _INSTRUCTION.match(line) or _TUPLE_INSTRUCTION.match(line)
        if m is None or computation is None:
          continue
        attrs = m.group("attrs")
        frame = re.search(r"stack_frame_id=(\d+)", attrs)
        op_name = re.search(r'op_name="((?:[^"\\]|\\.)*)"', attrs)
        calls = re.search(r"calls=%?([\w.\-]+)", attrs)
        self.instructions[m.group("name")] = dict(
            computation=computation, opcode=m.group("opcode"),
            shape=_dims(m.group("type")),
            operands=re.findall(r"%?([\w.\-]+)", m.group("operands")),
            attrs=attrs, frame=int(frame.group(1)) if frame else 0,
            op_name=op_name.group(1) if op_name else "",
            calls=calls.group(1) if calls else None)
        self.computations[computation].append(m.group("name"))
    self._frames(sections)

  def _frames(self, sections: dict) -> None:
    files = {i: v.strip('"') for i, v in sections.get("FileNames",
                                                      {}).items()}
    functions = {i: v.strip('"') for i, v in sections.get(
        "FunctionNames", {}).items()}
    self.locations = {}
    for i, v in sections.get("FileLocations", {}).items():
      d = dict(re.findall(r"(\w+)=(\d+)", v))
      self.locations[i] = (files.get(int(d["file_name_id"]), "?"),
                           functions.get(int(d["function_name_id"]), "?"),
                           int(d.get("line", 0)))
    # XLA prints a frame's parent as its 1-based position: 0 is no parent.
    self.frames = {}
    for i, v in sections.get("StackFrames", {}).items():
      d = dict(re.findall(r"(\w+)=(\d+)", v))
      self.frames[i] = (int(d["file_location_id"]),
                        int(d["parent_frame_id"]) - 1)

  def stack(self, frame: int) -> list[tuple[str, str, int]]:
    """(file, function, line) from the innermost frame outward."""
    out, seen = [], set()
    while frame > 0 and frame not in seen and frame in self.frames:
      seen.add(frame)
      location, frame = self.frames[frame]
      out.append(self.locations.get(location, ("?", "?", 0)))
    return out

  def dot_flops(self, name: str) -> float:
    """2 x output elements x contracted elements of a dot, else 0; a fusion
    counts the dots it calls."""
    ins = self.instructions[name]
    if ins["opcode"] == "dot":
      lhs = self.instructions.get(ins["operands"][0], {}).get("shape", ())
      contracted = math.prod(lhs[d] for d in _ids(ins["attrs"],
                                                  "lhs_contracting_dims")
                             if d < len(lhs))
      return 2.0 * math.prod(ins["shape"]) * contracted
    if ins["calls"] in self.computations:
      return sum(self.dot_flops(n) for n in self.computations[ins["calls"]])
    return 0.0

  def source(self, name: str) -> dict:
    """The instruction whose metadata speaks for `name`: for a fusion, the
    dot it calls with the most FLOPs, else its root, else itself."""
    ins = self.instructions[name]
    inner = self.computations.get(ins["calls"] or "", [])
    with_frames = [n for n in inner if self.instructions[n]["frame"]]
    if with_frames:
      best = max(with_frames, key=lambda n: (self.dot_flops(n), n ==
                                             with_frames[-1]))
      return self.instructions[best]
    return ins


# ==============================================================================
# Parts of the model.
# ==============================================================================
# Innermost frame (function qualname) -> part; the first frame from the
# innermost outward that names one decides.
PARTS = {
    "_blocked_attend": "attention: sliding window",
    "attend": "attention: full",
    "tables": "attention: projections",  # Rotary positions.
    "apply": "attention: projections",
    "rotate_half": "attention: projections",
    "Attention.__call__": "attention: projections",
    "SelfAttention.__call__": "attention: projections",
    "GeGLU.__call__": "MLP",
    "FeedForward.__call__": "MLP",
    "gather_positions": "MLM head",
    "PredictionHead.__call__": "MLM head",
    "Decoder.__call__": "MLM head",
    "MaskedLMHead.__call__": "MLM head",
    "mlm_sums": "MLM loss",
    "loss_sums": "MLM loss",
    "Embeddings.__call__": "embeddings",
    "LayerNorm.__call__": "layer norms",
    "batch_work": "metrics",
    "metrics": "metrics",
    "counts": "metrics",
}


def part_of(hlo: Hlo, name: str) -> tuple[str, str]:
  """(part, pass) of instruction `name`."""
  ins = hlo.source(name)
  stack = hlo.stack(ins["frame"])
  if any("/optax/" in f or f.endswith("training/optim.py") for f, _, _ in
         stack):
    return "optimizer", "optimizer"
  direction = "backward" if "transpose(" in ins["op_name"] else "forward"
  for file, function, _ in stack:
    part = PARTS.get(function)
    if part is not None and "/bert_jax/" in file:
      return part, direction
  ours = [f"{os.path.basename(f)}:{fn}" for f, fn, _ in stack
          if "/bert_jax/" in f]
  if ours:
    return f"other: {ours[0]}", direction
  if ins["op_name"].startswith("state["):
    return "other: parameter copies", direction
  return f"other: {ins['opcode']}", direction


# ==============================================================================
# The trace.
# ==============================================================================
def op_times(trace_dir: str, names) -> dict[str, float]:
  """Microseconds per HLO instruction summed over the trace's events."""
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"),
                    recursive=True)
  if not paths:
    raise FileNotFoundError(f"no *.trace.json.gz under {trace_dir}: the "
                            "profiler wrote no trace.")
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  out = collections.Counter()
  for e in events:
    if e.get("ph") == "X" and e.get("name") in names:
      out[e["name"]] += float(e.get("dur", 0.0))
  return dict(out)


def breakdown(hlo: Hlo, times_us: dict[str, float], steps: int) -> dict:
  """Per (part, pass): ms per step, share of op time, dot GFLOP per step,
  GFLOP/s; and per instruction."""
  parts = collections.defaultdict(lambda: dict(ms=0.0, gflop=0.0, ops=0))
  rows = []
  total_us = sum(times_us.values())
  for name, us in times_us.items():
    part, direction = part_of(hlo, name)
    gflop = hlo.dot_flops(name) / 1e9
    p = parts[part, direction]
    p["ms"] += us / 1e3 / steps
    p["gflop"] += gflop
    p["ops"] += 1
    rows.append(dict(instruction=name, part=part, direction=direction,
                     ms=us / 1e3 / steps, gflop=gflop,
                     opcode=hlo.instructions[name]["opcode"]))
  table = []
  for (part, direction), p in parts.items():
    table.append(dict(part=part, direction=direction, ms=p["ms"],
                      share=p["ms"] * 1e3 * steps / max(total_us, 1e-9),
                      gflop=p["gflop"], instructions=p["ops"],
                      gflops_per_s=p["gflop"] / (p["ms"] / 1e3)
                      if p["ms"] > 0 else 0.0))
  table.sort(key=lambda r: -r["ms"])
  rows.sort(key=lambda r: -r["ms"])
  return dict(op_ms_per_step=total_us / 1e3 / steps, parts=table,
              instructions=rows)


def profile(config, steps: int, warmup: int, trace_dir: str = "",
            rounds: int = 1, task: bool = False) -> dict:
  batches = None
  if task:  # The run's own config and batches (one shape).
    config, batches = benchmarking.task_batches(config, max(steps, 4))
  ours = benchmarking.Ours(config, host_batches=batches)
  benchmarking.alternate([ours], warmup=warmup, rounds=rounds, steps=steps)
  wall = benchmarking.stats(ours.times)
  hlo = Hlo(ours.compiled.executable.as_text())
  with tempfile.TemporaryDirectory() as tmp:
    where = trace_dir or tmp
    with jax.profiler.trace(where):
      ours.run(steps, record=False)
    times = op_times(where, hlo.instructions)
  cost = ours.compiled.cost
  out = breakdown(hlo, times, steps)
  m, d = config.model, config.data
  out.update(
      model=f"{config.objective.name} {m.num_hidden_layers}x{m.hidden_size} "
      f"(FFN {m.intermediate_size}, vocab {m.vocab_size}, {m.dtype}, "
      f"attention {m.get('attention_impl', 'xla')})",
      batch=(f"{config.train.batch_size} x "
             f"{ours.host_batches[0]['input_ids'].shape[-1]}" + (
                 f" ({'packed' if d.get('packing') else 'padded'} task "
                 "rows)" if task else
                 f", {d.max_predictions_per_seq} predictions per row")),
      device=f"{jax.device_count()} {jax.devices()[0].device_kind}",
      step_ms_p50=1e3 * wall["p50"], step_ms_min=1e3 * wall["min"],
      xla_gflop_per_step=cost.flops / 1e9,
      dot_gflop_per_step=sum(r["gflop"] for r in out["parts"]))
  return out


def format_report(r: dict, top: int) -> str:
  lines = [
      f"{r['model']}, batch {r['batch']}, on {r['device']}: step p50 "
      f"{r['step_ms_p50']:.1f} ms (min {r['step_ms_min']:.1f}); op time "
      f"{r['op_ms_per_step']:.1f} ms per step; matmul {r['dot_gflop_per_step']:.2f}"
      f" GFLOP of XLA's {r['xla_gflop_per_step']:.2f} GFLOP per step.",
      f"{'part':<34} {'pass':<9} {'ms/step':>8} {'% time':>7} "
      f"{'GFLOP':>8} {'% flop':>7} {'GFLOP/s':>8}"]
  flop = max(r["dot_gflop_per_step"], 1e-12)
  for p in r["parts"]:
    lines.append(f"{p['part'][:34]:<34} {p['direction']:<9} "
                 f"{p['ms']:>8.2f} {100 * p['share']:>6.1f}% "
                 f"{p['gflop']:>8.3f} {100 * p['gflop'] / flop:>6.1f}% "
                 f"{p['gflops_per_s']:>8.1f}")
  lines.append(f"top {top} instructions:")
  for i in r["instructions"][:top]:
    lines.append(f"  {i['instruction'][:40]:<40} {i['opcode']:<10} "
                 f"{i['part'][:28]:<28} {i['direction']:<9} "
                 f"{i['ms']:>8.2f} ms {i['gflop']:>8.3f} GFLOP")
  return "\n".join(lines)


def main(argv):
  del argv
  r = profile(FLAGS.config, FLAGS.steps, FLAGS.warmup, FLAGS.trace_dir,
              FLAGS.rounds, FLAGS.task)
  print(format_report(r, FLAGS.top))
  if FLAGS.json:
    with open(FLAGS.json, "w") as f:
      json.dump(r, f, indent=1)


if __name__ == "__main__":
  cli.run(main, define_flags)
