#!/usr/bin/env bash
# Files (CRDs) of an upstream project's Go module, from the module proxy (the one source these machines reach),
# into ${KE_CACHE:-<repo>/.cache}/<name>/<version>/. One line of output; a warm re-run only checks the files.
#
#   hack/setup/module-crds.sh <name> <module> <version> <folder in the module> <file>...
#
# A <file> may name a sub-folder of <folder> (`roles/x.yaml`); one ending in `/` takes every *.yaml of that folder.
# Called by keda-crds.sh, argocd-crds.sh and knative-config.sh, which pin what they take.
set -euo pipefail
NAME=$1 MODULE=$2 VERSION=$3 FOLDER=$4
shift 4
FILES=("$@")

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${KE_CACHE:-$ROOT/.cache}/$NAME/$VERSION
have=0
for f in "${FILES[@]}"; do
  if [[ $f == */ ]]; then
    [[ -f $DEST/$f.complete ]] && have=$((have + 1))  # written once the whole folder is copied
  else
    [[ -s $DEST/$f ]] && have=$((have + 1))
  fi
done
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
copy() {
  mkdir -p "$(dirname "$DEST/$1")"
  install -m 0644 "$dir/$FOLDER/$1" "$DEST/$1.tmp" && mv "$DEST/$1.tmp" "$DEST/$1"
}
for f in "${FILES[@]}"; do
  if [[ $f == */ ]]; then
    [[ -d $dir/$FOLDER/$f ]] || { echo "no $FOLDER/$f in the $NAME module" >&2; exit 1; }
    for g in "$dir/$FOLDER/$f"*.yaml; do copy "$f$(basename "$g")"; done
    touch "$DEST/$f.complete"
  else
    copy "$f"
  fi
done
echo "$NAME $VERSION CRDs into $DEST"
