#!/usr/bin/env bash
# Renders one install manifest per Kafka provider from the Kustomize overlays:
#   kustomize/overlays/<provider>  ->  dist/install-<provider>.yaml
# `kubectl apply -f dist/install-<provider>.yaml` installs the same objects as `kubectl apply -k` of the overlay.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${KE_CACHE:-$ROOT/.cache}/bin
KUSTOMIZE=${KUSTOMIZE:-$BIN/kustomize}
OUT=${OUT:-$ROOT/dist}
CRDS=$ROOT/src/kafka_eventing/controller/crds

[[ -x $KUSTOMIZE ]] || { echo "kustomize not found at $KUSTOMIZE (run: make setup)" >&2; exit 1; }

# The Kustomize tree and the chart carry copies of the CRDs (neither tool may read outside its tree), written by
# `make generate` (hack/generate.py decides which Kustomize base or component holds each); a stale or missing copy
# would ship an old schema, so refuse to render one.
for crd in "$CRDS"/*.yaml; do
  name=${crd##*/}
  mapfile -t copies < <(find "$ROOT/kustomize" -name "$name" -type f)
  [[ ${#copies[@]} -eq 1 ]] || { echo "expected one Kustomize copy of $name, found ${#copies[@]} (run: make generate)" >&2; exit 1; }
  for copy in "${copies[0]}" "$ROOT/charts/kafka-eventing/files/crds/$name"; do
    if ! cmp -s "$crd" "$copy"; then
      echo "stale CRD copy: $copy differs from $crd (run: make generate)" >&2
      exit 1
    fi
  done
done

mkdir -p "$OUT"
version=$(awk '$1 == "version:" { print $2; exit }' "$ROOT/charts/kafka-eventing/Chart.yaml")
for overlay in "$ROOT"/kustomize/overlays/*/; do
  provider=$(basename "$overlay")
  target=$OUT/install-$provider.yaml
  {
    echo "# generated, do not edit: rendered by hack/manifests.sh from kustomize/overlays/$provider"
    echo "# (kafka-eventing chart $version). Edit the overlay, then run \`make manifests\`."
    "$KUSTOMIZE" build "$overlay"
  } >"$target.tmp"
  mv "$target.tmp" "$target"
  echo "wrote ${target#"$ROOT"/} ($(grep -c '^kind:' "$target") objects)"
done
