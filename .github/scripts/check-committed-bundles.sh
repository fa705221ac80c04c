#!/usr/bin/env bash
# `fastpath check` of every committed bundle (bundles/*.fastpath.tar.gz) against this tree and its
# own trust policy (the PR gate reads the base branch's instead). A broken signature, manifest,
# binding, spec, plan, gate or tier fails; a merely stale attested part is a warning
# (--freshness warn), repeated at the end as `bundles: WARNING: BUNDLE: warning: stale PART: ...`.
#   FASTPATH   the fastpath command (default: ./dev fastpath)
# Exit 0 all pass (stale or not), 1 a bundle failed or is misnamed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
read -r -a fastpath <<< "${FASTPATH:-./dev fastpath}"
shopt -s nullglob
bundles=(bundles/*.fastpath.tar.gz)
if [ ${#bundles[@]} -eq 0 ]; then echo "bundles: no committed bundle under bundles/"; exit 0; fi
failed=0
warnings=()
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for b in "${bundles[@]}"; do
  stem=${b##*/}
  stem=${stem%.fastpath.tar.gz}
  tier=${stem##*.}
  if [ "$stem" = "$tier" ] || { [ "$tier" != smoke ] && [ "$tier" != full ]; }; then
    echo "bundles: FAIL $b: the name must be NAME.smoke.fastpath.tar.gz or NAME.full.fastpath.tar.gz"
    failed=1
    continue
  fi
  echo "bundles: fastpath check $b --require-tier $tier --freshness warn"
  "${fastpath[@]}" check "$b" --freshness warn --require-tier "$tier" \
    --trust bundles/trusted_keys.toml --source . > "$log" 2>&1
  rc=$?
  cat "$log"
  while IFS= read -r line; do
    warnings+=("$b: ${line#"${line%%[![:space:]]*}"}")
  done < <(grep -E 'warning: stale' "$log")
  if [ $rc -eq 0 ]; then
    echo "bundles: ok $b"
  else
    echo "bundles: FAIL $b (fastpath check exited $rc; reasons above)"
    failed=1
  fi
done
for w in "${warnings[@]}"; do
  echo "bundles: WARNING: $w (re-make it: fastpath verify --tier TIER --key KEY, then commit the bundle)"
done
exit $failed
