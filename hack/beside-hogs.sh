#!/usr/bin/env bash
# Runs a command beside HOGS busy loops (`yes > /dev/null`, default 2): the load under which the suite must still pass
# on this 2-core machine (docs/testing.md). The loops end with the command, however it ends.
set -euo pipefail
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
for _ in $(seq "${HOGS:-2}"); do
  yes >/dev/null &
  pids+=("$!")
done
"$@"
