#!/usr/bin/env bash
# One piece of the full tier on the lent H200, inside one 10-minute command:
#   bash lab/gpu_full_tier.sh SECONDS SUITES [VERIFY ARGS...]
# runs `fastpath verify --tier full --only SUITES` in ~/full (a fresh run, or the one an earlier
# call left there: --resume) under lab/gpu_steps.sh, and returns the run directory as
# $OUT/full.tar.gz after every call, so a lost machine loses at most that call. On a fresh
# machine, carry the last full.tar.gz as .carry/full.tar.gz: it is unpacked to resume from.
# The first call of a machine unpacks the carried packages (.carry/part-* then ~/carry/unpack.sh).
set -u
secs=$1; suites=$2; shift 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if [ -f ~/carry/unpack.sh ] && [ ! -f ~/carry/env.sh ]; then bash ~/carry/unpack.sh; fi
# Without the carried packages (fla-core, CuTe DSL, xgrammar, lm-eval) every case would fail on
# its import: session 42's perf call, given a fresh machine, spent 160 s learning that
if [ ! -f ~/carry/env.sh ]; then
  echo "gpu_full_tier: the carried packages are not on this machine (~/carry/env.sh missing: a fresh machine?);" \
       "carry .carry/part-00, then .carry/part-01 with cp .carry/part-01/* ~/carry/ && bash ~/carry/unpack.sh, then call again" >&2
  exit 2
fi
if [ ! -d ~/full ] && [ -f .carry/full.tar.gz ]; then tar -C ~ -xzf .carry/full.tar.gz; fi
where="--out $HOME/full"; [ -d ~/full ] && where="--resume $HOME/full"
[ -d ~/full ] || echo "gpu_full_tier: a fresh run in ~/full (no run here to resume, none carried as .carry/full.tar.gz)"
bash lab/gpu_steps.sh "verify:$secs:fastpath verify --tier full $where --only $suites $*"
tar -C ~ -czf "$OUT/full.tar.gz" full
ls -la "$OUT"
