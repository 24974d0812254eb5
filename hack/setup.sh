#!/usr/bin/env bash
# make setup / make setup-e2e: the real parts from the package registries into git-ignored folders (.venv, .cache).
# One progress line per step, and a "still running" line every 10 s of a long one; a warm re-run only verifies.
#
#   hack/setup.sh                  what `make test` runs on: the venv, Kafka, Spark's connector, the Go tools of the
#                                  host tiers (API server, Knative's controller, helm, ...), the CRDs it installs
#   hack/setup.sh e2e              what `make e2e` adds: the node packages (containerd, docker.io, ...) and the Go tools
#                                  only the pod and kind tiers run (kubelet, kube-scheduler, kubeadm, kube-proxy,
#                                  CoreDNS, kind, wathola)
#   hack/setup.sh python-run kafka only those steps (`make run` needs only the roles' packages and Kafka)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export KE_CACHE="${KE_CACHE:-$ROOT/.cache}"
mkdir -p "$KE_CACHE/logs"
cd "$ROOT"

TEST_STEPS=(python kafka spark-kafka go-tools keda-crds argocd-crds knative-config)
E2E_STEPS=(node-pkgs go-tools-e2e)
STEPS=("${TEST_STEPS[@]}" "${E2E_STEPS[@]}" python-run)
WANT=("$@")
[[ ${#WANT[@]} -gt 0 ]] || WANT=("${TEST_STEPS[@]}")
[[ "${WANT[*]}" != e2e ]] || WANT=("${E2E_STEPS[@]}")
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
step python-run  hack/setup/python.sh run
step kafka       hack/setup/maven.sh kafka
step spark-kafka hack/setup/maven.sh spark-kafka
step node-pkgs   hack/setup/node-packages.sh
# Go-built tools print one line per tool themselves.
if wanted go-tools; then hack/setup/go-tools.sh test; fi
if wanted go-tools-e2e; then hack/setup/go-tools.sh e2e; fi
step keda-crds   hack/setup/keda-crds.sh
step argocd-crds hack/setup/argocd-crds.sh
step knative-config hack/setup/knative-config.sh
echo "[setup] done in $((SECONDS - t_all))s"
