#!/usr/bin/env bash
# KEDA's CRDs (ScaledObject, TriggerAuthentication) for the controller's integration tests, taken from the
# kedacore/keda Go module into ${KE_CACHE:-<repo>/.cache}/keda/<version>/ (hack/setup/module-crds.sh).
set -euo pipefail
KEDA_VERSION=v2.21.0
exec "$(dirname "$0")/module-crds.sh" keda github.com/kedacore/keda/v2 "$KEDA_VERSION" config/crd/bases \
  keda.sh_scaledobjects.yaml keda.sh_triggerauthentications.yaml
