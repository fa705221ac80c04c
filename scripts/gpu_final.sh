#!/usr/bin/env bash
# The final H200 session, in two calls on one warm machine (each call <= 10 minutes):
#   bash scripts/gpu_final.sh bench-and-first-suites   # decode benchmark + verify coverage,kernels
#   bash scripts/gpu_final.sh last-suites               # verify --resume parity,features
# The run directory lives on the machine (/tmp/fp-full) between the calls; every call copies
# the run's state and bundle archive into $OUT so nothing is lost if the machine goes back.
set -u
RUN=/tmp/fp-full
save() {
  tar -C "$RUN" -czf "$OUT/fp-full-run.tar.gz" . 2>/dev/null
  cp "$RUN"/*.fastpath.tar.gz "$OUT/" 2>/dev/null || true
}
trap save EXIT
case "${1:-}" in
  bench-and-first-suites)
    bash scripts/gpu_steps.sh \
      "bench:240:python3 -m optimized_model.k3.fast.gpu_bench --budget 200 --kernel-budget 75 --ktime-budget 45" \
      "verify1:300:fastpath verify --tier full --out $RUN --only coverage,kernels"
    ;;
  last-suites)
    bash scripts/gpu_steps.sh "verify2:560:fastpath verify --tier full --resume $RUN --only parity,features"
    ;;
  *) echo "usage: $0 bench-and-first-suites | last-suites" >&2; exit 2 ;;
esac
