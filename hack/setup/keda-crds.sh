#!/usr/bin/env bash
# KEDA's CRDs (ScaledObject, TriggerAuthentication) for the controller's integration tests, taken from the
# kedacore/keda Go module on the module proxy (the one source these machines reach) into
# ${KE_CACHE:-<repo>/.cache}/keda/<version>/. One line of output; a warm re-run only checks the files.
set -euo pipefail
KEDA_VERSION=v2.21.0
FILES=(keda.sh_scaledobjects.yaml keda.sh_triggerauthentications.yaml)

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${KE_CACHE:-$ROOT/.cache}/keda/$KEDA_VERSION
if [[ -s $DEST/${FILES[0]} && -s $DEST/${FILES[1]} ]]; then
  echo "ok (cached, KEDA $KEDA_VERSION CRDs)"; exit 0
fi
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || { echo "Go not found (set GO=/path/to/go or put go on PATH)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
# `go mod download` needs no module of ours; -json tells where the module's files were unpacked.
dir=$(cd "${TMPDIR:-/tmp}" && "$GO" mod download -json "github.com/kedacore/keda/v2@$KEDA_VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n $dir && -d $dir/config/crd/bases ]] || { echo "no config/crd/bases in the KEDA module ($dir)" >&2; exit 1; }
mkdir -p "$DEST"
for f in "${FILES[@]}"; do
  install -m 0644 "$dir/config/crd/bases/$f" "$DEST/$f.tmp" && mv "$DEST/$f.tmp" "$DEST/$f"
done
echo "KEDA $KEDA_VERSION CRDs into $DEST"
