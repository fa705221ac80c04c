#!/usr/bin/env bash
# A training state (53 MiB) and the tracked files (12 MiB) pass the 64 MiB one device call carries,
# so a resumed run's state travels in two calls, into ignored folders the machine keeps between
# calls (docs/perf-notes.md, session 26). This lays the state of STATE_DIR out as .train/c1
# (state-00, state-01) and .train/c2 (the rest), hard links, and prints the two calls:
#   bash lab/train/split_state.sh .train/run3c
set -euo pipefail
state=${1:?usage: bash lab/train/split_state.sh STATE_DIR (a folder with state-00..03.safetensors)}
for f in "$state"/state-0{0,1,2,3}.safetensors "$state"/train-log.jsonl; do
  [ -f "$f" ] || { echo "split_state: $f is missing: STATE_DIR must hold a run's state-00..03 and train-log.jsonl" >&2; exit 1; }
done
state=$(cd "$state" && pwd)
cd "$(dirname "$0")/../.."
rm -rf .train/c1 .train/c2
mkdir -p .train/c1 .train/c2
ln "$state"/state-00.safetensors "$state"/state-01.safetensors .train/c1/
ln "$state"/state-02.safetensors "$state"/state-03.safetensors "$state"/train-log.jsonl .train/c2/
[ -f "$state"/autotune.tar.gz ] && ln "$state"/autotune.tar.gz .train/c2/
echo "call 1 (carry [\".train/c1\"]): ls .train/c1"
echo "call 2 (carry [\".whl\", \".train/c2\"]), at once: mkdir -p .train/r && cp .train/c1/* .train/c2/* .train/r/ && bash lab/train/h200.sh .train/r [OPTIONS]"
