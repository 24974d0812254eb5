#!/usr/bin/env bash
# Files (CRDs) of an upstream project's Go module, from the module proxy (the one source these machines reach),
# into ${KE_CACHE:-<repo>/.cache}/<name>/<version>/. One line of output; a warm re-run only checks the files.
#
#   hack/setup/module-crds.sh <name> <module> <version> <folder in the module> <file>...
#
# Called by keda-crds.sh and argocd-crds.sh, which pin what they take.
set -euo pipefail
NAME=$1 MODULE=$2 VERSION=$3 FOLDER=$4
shift 4
FILES=("$@")

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${KE_CACHE:-$ROOT/.cache}/$NAME/$VERSION
have=0
for f in "${FILES[@]}"; do [[ -s $DEST/$f ]] && have=$((have + 1)); done
if [[ $have == "${#FILES[@]}" ]]; then
  echo "ok (cached, $NAME $VERSION CRDs)"; exit 0
fi
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
[[ -x $GO ]] || { echo "Go not found (set GO=/path/to/go or put go on PATH)" >&2; exit 1; }
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
# `go mod download` needs no module of ours; -json tells where the module's files were unpacked.
dir=$(cd "${TMPDIR:-/tmp}" && "$GO" mod download -json "$MODULE@$VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[[ -n $dir && -d $dir/$FOLDER ]] || { echo "no $FOLDER in the $NAME module ($MODULE@$VERSION: '$dir')" >&2; exit 1; }
mkdir -p "$DEST"
for f in "${FILES[@]}"; do
  install -m 0644 "$dir/$FOLDER/$f" "$DEST/$f.tmp" && mv "$DEST/$f.tmp" "$DEST/$f"
done
echo "$NAME $VERSION CRDs into $DEST"
