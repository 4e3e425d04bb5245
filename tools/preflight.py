"""Multi-host preflight: can every process join, and what does each one see?

Run on every worker of a Cloud TPU VM slice (``tools/launch_tpu.sh`` does this
before training) or on each GPU host with the same flags as ``bert_jax.main``
(--distributed, --coordinator_address, --num_processes, --process_id; it
joins jax.distributed when the training run would):

  python tools/preflight.py                                   # TPU VM: from env
  python tools/preflight.py --coordinator_address=HOST0:1234 \
      --num_processes=2 --process_id=$RANK                    # GPU / CPU hosts

Prints one line per process (index/count, local/global devices, platform),
refuses a `--workdir` that is not ``gs://`` when there are several processes
(each host would write its own local directory: checkpoints split across
hosts), before anything is compiled, and then runs one tiny cross-process
all-reduce. Exits 0 when all is well;
otherwise exits 1 with one sentence saying what failed, within --timeout
seconds instead of hanging on a coordinator that never answers.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from absl import flags

from bert_jax import cli


def _fail(message: str) -> None:
  print(f"preflight FAILED on {socket.gethostname()}: {message}",
        file=sys.stderr, flush=True)
  os._exit(1)  # Also from the watchdog thread, past a blocked initialize().


def check_workdir(workdir: str | None, process_count: int) -> None:
  """Several hosts need one shared workdir: a bucket, not a local path."""
  if process_count > 1 and workdir and not workdir.startswith("gs://"):
    raise ValueError(
        f"--workdir={workdir} is a local path but this job has "
        f"{process_count} processes (a multi-host slice): each host would "
        "write its own copy. Use storage every host sees, e.g. "
        "--workdir=gs://BUCKET/run.")


def define_flags(flag_values, argv=None) -> None:
  del argv  # No --config here.
  cli.define_distributed(flag_values=flag_values)
  cli.define_workdir("The training workdir: must be gs:// on several hosts.",
                     flag_values=flag_values, required=False)
  flags.DEFINE_integer("timeout", 300, "Seconds to wait for all processes to "
                       "join.", flag_values=flag_values)


def main(argv=None) -> int:
  args, _ = cli.parse(argv, define_flags, __doc__)

  watchdog = threading.Timer(args.timeout, _fail, args=(
      f"no result after {args.timeout}s: jax.distributed could not connect "
      f"(coordinator {args.coordinator_address or 'from the TPU environment'}"
      "). Check that every worker runs this command, that the coordinator "
      "host:port is reachable from this host (firewall, port in use), and "
      "that --num_processes matches the number of workers.",))
  watchdog.daemon = True
  watchdog.start()

  import jax
  if cli.wants_distributed(args):
    kwargs = {}
    if args.coordinator_address:
      kwargs = dict(coordinator_address=args.coordinator_address,
                    num_processes=args.num_processes,
                    process_id=args.process_id,
                    initialization_timeout=args.timeout)
    try:
      jax.distributed.initialize(**kwargs)
    except Exception as e:  # pylint: disable=broad-except
      _fail(f"jax.distributed.initialize({kwargs or 'from environment'}) "
            f"raised {type(e).__name__}: {str(e).splitlines()[0][:300]}")
  devices = jax.devices()
  print(f"preflight {socket.gethostname()}: process {jax.process_index()} of "
        f"{jax.process_count()}; {jax.local_device_count()} local / "
        f"{jax.device_count()} global devices; platform "
        f"{devices[0].platform} ({devices[0].device_kind})", flush=True)
  try:  # Before anything is compiled.
    check_workdir(args.workdir, jax.process_count())
  except ValueError as e:
    # Every process refuses; leave together, or the coordinator's exit
    # aborts the others before they print why.
    print(f"preflight FAILED on {socket.gethostname()}: {e}",
          file=sys.stderr, flush=True)
    jax.distributed.shutdown()
    return 1

  # One all-reduce over every device of every process.
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec
  mesh = jax.make_mesh((jax.device_count(),), ("all",))
  sh = NamedSharding(mesh, PartitionSpec("all"))
  local = np.ones((jax.local_device_count(),), np.float32)
  x = jax.make_array_from_process_local_data(sh, local)
  total = float(jax.jit(lambda a: a.sum(), out_shardings=NamedSharding(
      mesh, PartitionSpec()))(x))
  if total != jax.device_count():
    _fail(f"all-reduce over {jax.device_count()} devices gave {total}.")
  watchdog.cancel()
  if jax.process_index() == 0:
    print(f"preflight OK: {jax.process_count()} processes, "
          f"{jax.device_count()} devices, all-reduce {total:.0f}.", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
