r"""Peak memory (RSS) of ``python -m bert_jax.embed`` against its input size.

  python tools/embed_memory.py --model WORKDIR_OR_HF_DIR [--lines 100000] \
      [--repos new=.,old=/path/to/older/checkout] [--workdir /tmp/embed_mem]

Writes --lines lines of English prose (the sentences of the demo corpus,
CPython's bundled documentation, cycled) and runs the embed command line on
them with and without ``--per_token``, each in a fresh process that reports
its own peak RSS (VmHWM). With --repos, every checkout in turn (one
after the other per case, so machine noise hits all alike), e.g. this one
against another commit's. Prints one row per
(checkout, case): lines, token vectors, output bytes, peak RSS, wall time,
with the machine (CPU model, cores, load) and the commit of each checkout.
"""

import json
import os
import platform
import subprocess
import sys
import time

from absl import flags

from bert_jax import cli

# The child: the command line in-process, then its own peak RSS: VmHWM, the
# high-water mark of its memory since exec (getrusage's ru_maxrss carries
# over the RSS of the process that forked it).
_CHILD = """
import json, re, sys, time
from bert_jax import embed
start = time.time()
rc = embed.main(sys.argv[1:])
with open("/proc/self/status") as f:
  kb = int(re.search(r"VmHWM:\\s*(\\d+) kB", f.read()).group(1))
print("RESULT", json.dumps(dict(rc=rc, seconds=time.time() - start,
                                peak_rss_mb=kb / 1024)))
"""


def write_input(path: str, lines: int) -> int:
  """`lines` sentences of the demo corpus, cycled; returns their bytes."""
  from bert_jax.data import demo_corpus  # pylint: disable=g-import-not-at-top
  sentences = [s for _, doc in demo_corpus.demo_documents() for s in doc]
  with open(path, "w", encoding="utf-8") as f:
    for i in range(lines):
      f.write(sentences[i % len(sentences)] + "\n")
  return os.path.getsize(path)


def _commit(repo: str) -> str:
  try:
    return subprocess.run(["git", "-C", repo, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True,
                          check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "?"


def _cpu() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or "?"


def measure(repo: str, model: str, inp: str, out_dir: str,
            per_token: bool) -> dict:
  """One child run of the embed CLI from checkout `repo`."""
  out = os.path.join(out_dir, "vectors.npy")
  tok = os.path.join(out_dir, "tokens.npz")
  argv = ["--model", model, "--input", inp, "--output", out]
  if per_token:
    argv += ["--per_token", tok]
  repo = os.path.abspath(repo)
  env = dict(os.environ, PYTHONPATH=repo,
             JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  # cwd=repo: `python -c` puts the working directory first on sys.path.
  proc = subprocess.run([sys.executable, "-c", _CHILD, *argv], env=env,
                        cwd=repo, capture_output=True, text=True)
  lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
  if proc.returncode or not lines:
    raise SystemExit(f"error: embed from {repo} failed: "
                     f"{proc.stderr.strip().splitlines()[-1:]}")
  result = json.loads(lines[-1][len("RESULT "):])
  result["output_mb"] = sum(
      os.path.getsize(p) for p in ([out, tok] if per_token else [out])) / 2**20
  if per_token:
    import numpy as np  # pylint: disable=g-import-not-at-top
    with np.load(tok) as z:
      result["token_vectors"] = int(z["offsets"][-1])
  for p in (out, tok):
    if os.path.exists(p):
      os.remove(p)
  return result


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_model("A training workdir or Hugging Face BERT dir.",
                   flag_values=flag_values)
  cli.define_workdir("Where the input and the vectors go.",
                     flag_values=flag_values, default="/tmp/embed_memory")
  flags.DEFINE_integer("lines", 100_000, "Input lines.",
                       flag_values=flag_values)
  flags.DEFINE_string("repos", ".", "name=path,... checkouts to compare "
                      "(default: this one).", flag_values=flag_values)


def main(argv=None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)
  repos = [(r.split("=", 1) if "=" in r else (r, r))
           for r in args.repos.split(",") if r]
  workdir = os.path.abspath(args.workdir)
  model = os.path.abspath(args.model) if os.path.exists(
      args.model) else args.model
  os.makedirs(workdir, exist_ok=True)
  inp = os.path.join(workdir, "input.txt")
  size = write_input(inp, args.lines)
  print(f"embed peak RSS, {args.lines} lines ({size / 2**20:.1f} MB) of the "
        f"demo corpus, model {model}; {_cpu()}, {os.cpu_count()} CPUs, "
        f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())} at start; "
        f"{time.strftime('%Y-%m-%d %H:%M')}.")
  print(f"{'checkout':<28} {'case':<12} {'tokens':>10} {'output MB':>10} "
        f"{'peak RSS MB':>12} {'seconds':>8}")
  for per_token in (False, True):
    for name, repo in repos:
      r = measure(repo, model, inp, workdir, per_token)
      label = f"{name} ({_commit(repo)})"
      print(f"{label:<28} {'--per_token' if per_token else 'vectors':<12} "
            f"{r.get('token_vectors', ''):>10} {r['output_mb']:>10.1f} "
            f"{r['peak_rss_mb']:>12.1f} {r['seconds']:>8.1f}", flush=True)
  print(f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the end.")
  return 0


if __name__ == "__main__":
  sys.exit(main())
