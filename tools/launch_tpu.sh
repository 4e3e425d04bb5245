#!/usr/bin/env bash
# Run bert_jax on every worker of a Cloud TPU VM slice.
#
#   tools/launch_tpu.sh TPU_NAME ZONE [--project P] [--create TYPE]
#       [--queued] [--spot] [--version V] [--setup] [--no-preflight]
#       [--delete] [--dry-run] -- python -m bert_jax.main ... --workdir gs://B/run
#
# 1. (--create TYPE, e.g. v5litepod-16 or v4-32) creates the slice:
#    `tpu-vm create`, or with --queued a queued resource (waits until it is
#    ACTIVE); --spot asks for spot capacity; --version is the TPU runtime
#    (default tpu-ubuntu2204-base).
# 2. (--setup) copies this checkout to ~/bert_jax on every worker
#    (scp --worker=all) and pip-installs the package there (pip install -e .,
#    pins from requirements.txt).
# 3. Preflight on all workers (tools/preflight.py): each prints its process
#    index/count and local/global device counts, refuses a workdir that is
#    not gs:// when the slice has several hosts, then one all-reduce runs;
#    if jax.distributed cannot connect it fails within PREFLIGHT_TIMEOUT
#    seconds (default 120) with a message, instead of a silent hang.
# 4. Runs the command after `--` on all workers at once, the same command on
#    each (`ssh --worker=all`). On TPU VMs jax.distributed initializes from
#    the environment; no flags needed.
# 5. (--delete) deletes the slice (or queued resource) afterwards, also when
#    a step failed.
# --dry-run prints each gcloud command (one line, shell-quoted) instead of
# running it.
#
# The workdir must be storage every worker sees (gs://...): a local path
# is a different directory on each host.
set -euo pipefail

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 2 ]] || usage
TPU_NAME=$1; ZONE=$2; shift 2
PROJECT_FLAG=(); SETUP=0; PREFLIGHT=1; DRY_RUN=0; DELETE=0
CREATE_TYPE=""; QUEUED=0; SPOT=0; VERSION=tpu-ubuntu2204-base
while [[ $# -gt 0 ]]; do
  case $1 in
    --project) PROJECT_FLAG=(--project "$2"); shift 2 ;;
    --create) CREATE_TYPE=$2; shift 2 ;;
    --queued) QUEUED=1; shift ;;
    --spot) SPOT=1; shift ;;
    --version) VERSION=$2; shift 2 ;;
    --setup) SETUP=1; shift ;;
    --no-preflight) PREFLIGHT=0; shift ;;
    --delete) DELETE=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; usage ;;
  esac
done
[[ $# -gt 0 ]] || { echo "error: no command after --" >&2; usage; }
if [[ $QUEUED == 1 && -z $CREATE_TYPE ]]; then
  echo "error: --queued needs --create TYPE" >&2; exit 2
fi
REMOTE_DIR=${REMOTE_DIR:-bert_jax}
PREFLIGHT_TIMEOUT=${PREFLIGHT_TIMEOUT:-120}
LOC=(--zone "$ZONE" "${PROJECT_FLAG[@]}")

run() {  # Run a command, or print it (shell-quoted, one line) with --dry-run.
  if [[ $DRY_RUN == 1 ]]; then
    printf '%q ' "$@" | sed 's/ $//'; echo
  else
    "$@"
  fi
}

all_workers() {  # The same shell command on every worker, output streamed.
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOC[@]}" --worker=all \
    --command "$1"
}

delete_slice() {
  if [[ $QUEUED == 1 ]]; then
    run gcloud compute tpus queued-resources delete "$TPU_NAME" "${LOC[@]}" \
      --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$TPU_NAME" "${LOC[@]}" --quiet
  fi
}

# The workdir of the training command, handed to preflight's check.
WORKDIR=""
ARGS=("$@")
for i in "${!ARGS[@]}"; do
  case ${ARGS[$i]} in
    --workdir=*) WORKDIR=${ARGS[$i]#--workdir=} ;;
    --workdir) WORKDIR=${ARGS[$((i + 1))]:-} ;;
  esac
done

if [[ -n $CREATE_TYPE ]]; then
  SPOT_FLAG=(); [[ $SPOT == 1 ]] && SPOT_FLAG=(--spot)
  if [[ $QUEUED == 1 ]]; then
    run gcloud compute tpus queued-resources create "$TPU_NAME" "${LOC[@]}" \
      --node-id "$TPU_NAME" --accelerator-type "$CREATE_TYPE" \
      --runtime-version "$VERSION" "${SPOT_FLAG[@]}"
  else
    run gcloud compute tpus tpu-vm create "$TPU_NAME" "${LOC[@]}" \
      --accelerator-type "$CREATE_TYPE" --version "$VERSION" "${SPOT_FLAG[@]}"
  fi
fi
[[ $DELETE == 1 ]] && trap delete_slice EXIT
if [[ $QUEUED == 1 ]]; then
  echo "== waiting for queued resource $TPU_NAME to be ACTIVE" >&2
  while :; do
    STATE=$(run gcloud compute tpus queued-resources describe "$TPU_NAME" \
      "${LOC[@]}" --format 'value(state.state)')
    [[ $DRY_RUN == 1 ]] && { echo "$STATE"; break; }
    [[ $STATE == ACTIVE ]] && break
    if [[ $STATE == FAILED || $STATE == SUSPENDED ]]; then
      echo "error: queued resource $TPU_NAME is $STATE" >&2; exit 1
    fi
    sleep 30
  done
fi

if [[ $SETUP == 1 ]]; then
  REPO=$(cd "$(dirname "$0")/.." && pwd)
  [[ $DRY_RUN == 1 ]] ||
    tar -C "$REPO" --exclude=.git -czf /tmp/bert_jax_src.tgz .
  run gcloud compute tpus tpu-vm scp /tmp/bert_jax_src.tgz "$TPU_NAME":~/ \
    "${LOC[@]}" --worker=all
  all_workers "mkdir -p ~/$REMOTE_DIR \
&& tar -C ~/$REMOTE_DIR -xzf ~/bert_jax_src.tgz && cd ~/$REMOTE_DIR \
&& pip install -q -e . 'jax[tpu]==0.10.2'"
fi

if [[ $PREFLIGHT == 1 ]]; then
  echo "== preflight on all workers of $TPU_NAME" >&2
  PF="cd ~/$REMOTE_DIR && python tools/preflight.py"
  PF+=" --timeout $PREFLIGHT_TIMEOUT"
  [[ -n $WORKDIR ]] && PF+=" --workdir $(printf '%q' "$WORKDIR")"
  if ! all_workers "$PF"; then
    echo "error: preflight failed on at least one worker (see above): a" \
         "workdir every host sees (gs://) is needed on a multi-host slice," \
         "and all workers must form one jax.distributed job. Is every" \
         "worker up and running the same code? Is the slice healthy" \
         "(gcloud compute tpus tpu-vm describe $TPU_NAME --zone $ZONE)?" >&2
    exit 1
  fi
fi

CMD=$(printf '%q ' "$@")
echo "== running on all workers: $CMD" >&2
all_workers "cd ~/$REMOTE_DIR && ${CMD% }"
