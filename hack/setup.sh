#!/usr/bin/env bash
# make setup: every real part from the package registries into git-ignored folders (.venv, .cache).
# One progress line per step, and a "still running" line every 10 s of a long one; a warm re-run only verifies.
#
#   hack/setup.sh              every step
#   hack/setup.sh python kafka only those steps (`make run` needs no Go tools, node packages or CRDs)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export KE_CACHE="${KE_CACHE:-$ROOT/.cache}"
mkdir -p "$KE_CACHE/logs"
cd "$ROOT"

STEPS=(python kafka spark-kafka node-pkgs go-tools keda-crds argocd-crds knative-config)
WANT=("$@")
[[ ${#WANT[@]} -gt 0 ]] || WANT=("${STEPS[@]}")
for w in "${WANT[@]}"; do
  [[ " ${STEPS[*]} " == *" $w "* ]] || { echo "[setup] unknown step '$w' (known: ${STEPS[*]})" >&2; exit 2; }
done
wanted() { [[ " ${WANT[*]} " == *" $1 "* ]]; }

step() {
  local name="$1"; shift
  wanted "$name" || return 0
  local t0=$SECONDS out rc=0 next=10
  out="$(mktemp)"
  "$@" >"$out" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (( SECONDS - t0 >= next )); then
      printf '[setup] %-12s still running (%ss)\n' "$name" "$((SECONDS - t0))"
      next=$((next + 10))
    fi
  done
  wait "$pid" || rc=$?
  if [[ $rc == 0 ]]; then
    printf '[setup] %-12s %s (%ss)\n' "$name" "$(tail -n1 "$out")" "$((SECONDS - t0))"
    rm -f "$out"
  else
    printf '[setup] %-12s FAILED\n%s\n' "$name" "$(cat "$out")"; rm -f "$out"; exit 1
  fi
}

t_all=$SECONDS
step python      hack/setup/python.sh
step kafka       hack/setup/maven.sh kafka
step spark-kafka hack/setup/maven.sh spark-kafka
step node-pkgs   hack/setup/node-packages.sh
# Go-built tools print one line per tool themselves.
if wanted go-tools; then hack/setup/go-tools.sh; fi
step keda-crds   hack/setup/keda-crds.sh
step argocd-crds hack/setup/argocd-crds.sh
step knative-config hack/setup/knative-config.sh
echo "[setup] done in $((SECONDS - t_all))s"
