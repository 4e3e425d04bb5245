#!/usr/bin/env bash
# Run bert_jax on every worker of a Cloud TPU VM slice.
#
#   tools/launch_tpu.sh TPU_NAME ZONE [--project P] [--setup] [--no-preflight] \
#       -- python -m bert_jax.main --config configs/base.py --workdir gs://BUCKET/run1
#
# 1. (--setup) copies this checkout to ~/bert_jax on every worker and
#    pip-installs the package (pip install -e ., pins from requirements.txt) there.
# 2. Preflight on all workers (tools/preflight.py): each prints its process
#    index/count and local/global device counts, then one all-reduce runs;
#    if jax.distributed cannot connect it fails within PREFLIGHT_TIMEOUT
#    seconds (default 120) with a message, instead of a silent hang.
# 3. Runs the command after `--` on all workers at once
#    (gcloud compute tpus tpu-vm ssh --worker=all). On TPU VMs
#    jax.distributed initializes from the environment; no flags needed.
#
# The workdir must be storage every worker sees (gs://...): a local path
# is a different directory on each host.
set -euo pipefail

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 2 ]] || usage
TPU_NAME=$1; ZONE=$2; shift 2
PROJECT_FLAG=(); SETUP=0; PREFLIGHT=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --project) PROJECT_FLAG=(--project "$2"); shift 2 ;;
    --setup) SETUP=1; shift ;;
    --no-preflight) PREFLIGHT=0; shift ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; usage ;;
  esac
done
[[ $# -gt 0 ]] || { echo "error: no command after --" >&2; usage; }
REMOTE_DIR=${REMOTE_DIR:-bert_jax}
PREFLIGHT_TIMEOUT=${PREFLIGHT_TIMEOUT:-120}

all_workers() {  # Run a shell command on every worker, streaming output.
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" --zone "$ZONE" \
    "${PROJECT_FLAG[@]}" --worker=all --command "$1"
}

if [[ $SETUP == 1 ]]; then
  REPO=$(cd "$(dirname "$0")/.." && pwd)
  tar -C "$REPO" --exclude=.git -czf /tmp/bert_jax_src.tgz .
  gcloud compute tpus tpu-vm scp /tmp/bert_jax_src.tgz "$TPU_NAME":~/ \
    --zone "$ZONE" "${PROJECT_FLAG[@]}" --worker=all
  all_workers "mkdir -p ~/$REMOTE_DIR && tar -C ~/$REMOTE_DIR -xzf ~/bert_jax_src.tgz \
    && cd ~/$REMOTE_DIR && pip install -q -e . 'jax[tpu]==0.10.2'"
fi

if [[ $PREFLIGHT == 1 ]]; then
  echo "== preflight on all workers of $TPU_NAME"
  if ! all_workers "cd ~/$REMOTE_DIR && python tools/preflight.py --timeout $PREFLIGHT_TIMEOUT"; then
    echo "error: preflight failed on at least one worker (see above): the" \
         "workers could not form one jax.distributed job. Is every worker" \
         "up and running the same code? Is the slice healthy" \
         "(gcloud compute tpus tpu-vm describe $TPU_NAME --zone $ZONE)?" >&2
    exit 1
  fi
fi

CMD=$(printf '%q ' "$@")
echo "== running on all workers: $CMD"
all_workers "cd ~/$REMOTE_DIR && $CMD"
