#!/usr/bin/env bash
# make setup: every real part from the package registries into git-ignored folders (.venv, .cache).
# One progress line per step; a warm re-run only verifies.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export KE_CACHE="${KE_CACHE:-$ROOT/.cache}"
mkdir -p "$KE_CACHE/logs"
cd "$ROOT"

step() {
  local name="$1"; shift
  local t0=$SECONDS out
  if out="$("$@" 2>&1)"; then
    printf '[setup] %-12s %s (%ss)\n' "$name" "$(tail -n1 <<<"$out")" "$((SECONDS - t0))"
  else
    printf '[setup] %-12s FAILED\n%s\n' "$name" "$out"; exit 1
  fi
}

t_all=$SECONDS
step python      hack/setup/python.sh
step kafka       hack/setup/maven.sh kafka
step spark-kafka hack/setup/maven.sh spark-kafka
step node-pkgs   hack/setup/node-packages.sh
# Go-built tools print one line per tool themselves.
hack/setup/go-tools.sh
step keda-crds   hack/setup/keda-crds.sh
step argocd-crds hack/setup/argocd-crds.sh
echo "[setup] done in $((SECONDS - t_all))s"
