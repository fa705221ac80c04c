#!/usr/bin/env bash
# One short H200 call: re-measure batches 1-4 after the gemv tuning change, then the parity and
# features suites on the full tier in a fresh run directory (state + bundle saved into $OUT).
set -u
RUN=/tmp/fp-full2
trap 'tar -C "$RUN" -czf "$OUT/fp-full2-run.tar.gz" . 2>/dev/null' EXIT
bash scripts/gpu_steps.sh \
  "bench:100:python3 -m optimized_model.k3.fast.gpu_bench --skip-kernels --skip-ktime --batches 1,2,4,8 --contexts 1024 --rounds 3 --budget 80" \
  "verify:330:fastpath verify --tier full --out $RUN --only parity,features"
