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

# The Kustomize base and the chart carry copies of the CRDs (neither tool may read outside its tree), written by
# `make generate`; a stale copy would ship an old schema, so refuse to render one.
for crd in "$CRDS"/*.yaml; do
  base=$ROOT/kustomize/base/crds
  # Types defined elsewhere (Broker, Trigger; KafkaSink; KafkaSource) are opt-in components, not part of the base
  # (hack/generate.py's OPTIONAL_CRDS).
  grep -q '^  group: eventing.knative.dev$' "$crd" && base=$ROOT/kustomize/components/broker-crds
  # The KafkaSink (upstream eventing-kafka-broker's type) is an opt-in component of its own.
  [[ ${crd##*/} == kafkasinks.yaml ]] && base=$ROOT/kustomize/components/sink-crds
  grep -q '^  group: sources.knative.dev$' "$crd" && base=$ROOT/kustomize/components/source-crds
  # The ResetOffset CRD is an opt-in component too.
  [[ ${crd##*/} == resetoffsets.yaml ]] && base=$ROOT/kustomize/components/resetoffset-crd
  # And the EventPolicy CRD (Knative Eventing's type).
  [[ ${crd##*/} == eventpolicies.yaml ]] && base=$ROOT/kustomize/components/eventpolicy-crd
  for copy in "$base/${crd##*/}" "$ROOT/charts/kafka-eventing/files/crds/${crd##*/}"; do
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
