#!/usr/bin/env bash
# Runs named GPU steps back to back on the lent H200, each under its own time limit, logging
# every step to $OUT/<step>.log so one failure never loses the others' output.
#   [GPU_LOGS=NAME] bash lab/gpu_steps.sh STEP:SECONDS:COMMAND [STEP:SECONDS:COMMAND ...]
# Expects the carried site packages (~/carry/env.sh) and the extra wheels in .whl/.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# GPU_LOGS names this invocation's logs (two may run side by side: training beside suites)
logs_name=${GPU_LOGS:-logs}
LOGS=/tmp/gpu-$logs_name; rm -rf "$LOGS"; mkdir -p "$LOGS"
# $OUT returns at most 8 files: step logs go into one archive at the end
trap 'tar -C "$LOGS" -czf "$OUT/$logs_name.tar.gz" .' EXIT
[ -f ~/carry/env.sh ] && . ~/carry/env.sh
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >"$LOGS/setup.log" 2>&1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
# register the engine entry point; --no-build-isolation because nothing can be downloaded there
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$LOGS/setup.log" 2>&1 || echo "setup: editable install failed (see setup.log)"
export PYTHONUNBUFFERED=1
summary=()
for spec in "$@"; do
  name=${spec%%:*}; rest=${spec#*:}; secs=${rest%%:*}; cmd=${rest#*:}
  echo "=== $name (limit ${secs}s): $cmd"
  start=$(date +%s)
  # SIGTERM at the limit (verify stops like Ctrl-C), SIGKILL 15 s later: a step that hangs on its
  # way out must not take the archive below past the command's limit (session 32's perf call did)
  timeout -k 15 "$secs" bash -c "$cmd" >"$LOGS/$name.log" 2>&1
  rc=$?
  summary+=("$name rc=$rc $(( $(date +%s) - start ))s")
  tail -n 25 "$LOGS/$name.log"
done
echo "=== summary"; printf '%s\n' "${summary[@]}"
