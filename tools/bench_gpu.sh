#!/usr/bin/env bash
# BERT-base, seq 128, bf16 training-step throughput and MFU on one GPU host.
#   bash tools/bench_gpu.sh [BATCH]      (default global batch 256; < 5 min)
# Needs the package and jax[cuda] installed (pip install -e . "jax[cuda12]==0.10.2").
# Runs with cuDNN flash attention
# (model.attention_impl=cudnn, which has no attention dropout) and, for
# reference, with XLA attention; MFU is against the spec-sheet bf16 peak of
# the device (flops.py: A100 312, H100/H200 989 TFLOP/s).
set -euo pipefail
cd "$(dirname "$0")/.."
BATCH="${1:-256}"
COMMON=(--config configs/base.py --config.model.dtype=bfloat16
        --config.data.seq_length=128 --config.data.max_predictions_per_seq=20
        --config.train.batch_size="$BATCH" --steps 10 --rounds 2 --warmup 2)
python -c "import jax; d = jax.devices(); print(len(d), d[0].device_kind); \
assert d[0].platform == 'gpu', 'no GPU visible to jax'"
echo "== cuDNN attention (attention dropout off)"
timeout 240 python tools/benchmark.py "${COMMON[@]}" \
  --config.model.attention_impl=cudnn \
  --config.model.attention_probs_dropout_prob=0.0 \
  || echo "cuDNN attention failed (see above)"
echo "== XLA attention (as default config, attention dropout 0.1)"
timeout 150 python tools/benchmark.py "${COMMON[@]}"
