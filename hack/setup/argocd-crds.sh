#!/usr/bin/env bash
# Argo CD's own CRDs (Application, ApplicationSet, AppProject), taken from the argoproj/argo-cd Go module into
# ${KE_CACHE:-<repo>/.cache}/argocd/<version>/ (hack/setup/module-crds.sh): tests/integration/test_gitops.py
# applies gitops/argocd/*.yaml to the real API server against them, so an upstream schema change fails there.
# v3.5.7 is the newest release whose go.mod the local Go (1.26) accepts; v3.6 needs Go 1.27.
set -euo pipefail
ARGOCD_VERSION=v3.5.7
exec "$(dirname "$0")/module-crds.sh" argocd github.com/argoproj/argo-cd/v3 "$ARGOCD_VERSION" manifests/crds \
  application-crd.yaml applicationset-crd.yaml appproject-crd.yaml
