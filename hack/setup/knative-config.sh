#!/usr/bin/env bash
# Knative Eventing core's released CRDs, ClusterRoles, ServiceAccount and ConfigMaps, taken from the knative.dev/eventing
# Go module into ${KE_CACHE:-<repo>/.cache}/knative/<version>/ (hack/setup/module-crds.sh):
# tests/integration/test_knative.py installs them and runs Knative's own controller (built from the same module
# version by go-tools.sh) against the test kube-apiserver. The version is the one hack/tools/knative/go.mod pins.
set -euo pipefail
MOD=$(dirname "$0")/../tools/knative/go.mod
KNATIVE_EVENTING_VERSION=$(awk '$1 == "knative.dev/eventing" { print $2; exit }' "$MOD")
[[ -n $KNATIVE_EVENTING_VERSION ]] || { echo "no knative.dev/eventing version in $MOD" >&2; exit 1; }
exec "$(dirname "$0")/module-crds.sh" knative knative.dev/eventing "$KNATIVE_EVENTING_VERSION" config/core \
  100-namespace.yaml 200-eventing-serviceaccount.yaml resources/ roles/ configmaps/
