#!/usr/bin/env bash
# Chart and manifest checks (`make lint-charts`, part of `make test`). Offline; fails on the first problem class:
#   1. helm lint --strict with every ci/*-values.yaml scenario and every values-<provider>.yaml preset
#   2. ct lint (chart-testing: Chart.yaml schema, yamllint of Chart.yaml and values, helm lint per ci file)
#   3. helm-docs drift: the committed README.md must equal what helm-docs generates
#   4. Kustomize overlays build
#   5. render assertions + schema validation of every render (Helm scenarios and Kustomize overlays) against
#      the Kubernetes 1.34 schemas bundled by kubernetes-validate and the KafkaChannel CRD: tests/chart/
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BIN=${KE_CACHE:-$ROOT/.cache}/bin
VENV=$ROOT/.venv
# ct calls helm, git, yamllint and yamale from PATH.
export PATH=$BIN:$VENV/bin:$PATH
export CT_CONFIG_DIR=$ROOT/hack/ct/etc
CHART=charts/kafka-eventing

for t in helm ct helm-docs kustomize; do
  [[ -x $BIN/$t ]] || { echo "lint-charts: $BIN/$t missing (run: make setup)" >&2; exit 1; }
done

step() { printf '\n== %s\n' "$*"; }
start=$SECONDS

step "helm lint"
for values in "$CHART"/ci/*-values.yaml "$CHART"/values-*.yaml; do
  # --strict turns template warnings into failures; the INFO about a missing icon is not one.
  # A preset that leaves the address (or IAM role) to the user gets the `--set`s its header gives.
  sets=()
  while IFS= read -r s; do sets+=(--set "$s"); done < <(sed -n "s/^#  *--set\(-string\)\? '\([^']*\)'.*/\2/p" "$values")
  out=$(helm lint --strict "$CHART" -f "$values" "${sets[@]}" 2>&1) || { echo "$out"; echo "helm lint failed with $values" >&2; exit 1; }
  echo "ok  $values"
done

step "ct lint"
ct lint --config ct.yaml --lint-conf lintconf.yaml --chart-yaml-schema hack/ct/etc/chart_schema.yaml \
  --all --validate-maintainers=false --check-version-increment=false

step "helm-docs drift"
for chart in charts/*/; do
  chart=${chart%/}
  if ! diff -u "$chart/README.md" <(helm-docs --dry-run --log-level warning --chart-search-root "$chart"); then
    echo "$chart/README.md is stale: run .cache/bin/helm-docs --chart-search-root charts and commit the result" >&2
    exit 1
  fi
  echo "ok  $chart/README.md"
done

step "kustomize build"
for overlay in kustomize/overlays/*/; do
  kustomize build "$overlay" >/dev/null
  echo "ok  $overlay"
done

step "render assertions and schema validation (pytest)"
"$VENV/bin/python" -m pytest -q tests/chart

echo
echo "lint-charts: all checks passed in $((SECONDS - start))s"
