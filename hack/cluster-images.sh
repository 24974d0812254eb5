#!/usr/bin/env bash
# The image archives the e2e tiers import (no registry): `make cluster-images` (roles: receiver, dispatcher,
# controller and the OS base with curl for `helm test`) and `make cluster-spark-image` (spark, in an archive of its own:
# only the kind tier imports its ~1 GB).
#
#   hack/cluster-images.sh roles|spark
#
# Keyed by their inputs, not by the commit: the tag is `src-<hash of the inputs>`, and an archive whose inputs did not
# change is not built again — neither in this clone (the stamp beside the archive) nor in a fresh clone on the same
# machine (the per-user cache, $KE_IMAGE_CACHE/cluster-<name>/<hash>.tar, as for the OS bases: hack/image-cache.sh).
# The OCI revision label inside is the commit that built it. Builds run under `nice`, so that the tests they overlap
# (CI builds them beside `make test`) keep the CPU they need.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${KE_CACHE:-$ROOT/.cache}"
IMAGE_CACHE="${KE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kafka-eventing/images}"
COMMON=(.dockerignore pyproject.toml requirements.lock src images/base hack/images.sh hack/base-image.sh
  hack/image-cache.sh hack/cluster-images.sh)
case "${1:-}" in
  roles) ARCHIVE="$CACHE/cluster/images/kafka-eventing-roles.tar"; ROLES=(receiver dispatcher controller)
         INPUTS=("${COMMON[@]}" images/receiver images/dispatcher images/controller) ;;
  spark) ARCHIVE="$CACHE/cluster/spark/kafka-eventing-spark.tar"; ROLES=(spark)
         INPUTS=("${COMMON[@]}" images/spark hack/setup/maven.sh hack/setup/maven/spark-kafka-pom.xml) ;;
  *) echo "usage: $0 roles|spark" >&2; exit 2 ;;
esac
NAME="cluster-$1"

key="$(cd "$ROOT" && find "${INPUTS[@]}" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z \
  | xargs -0 sha256sum | sha256sum | cut -c1-16)"
if [[ -f $ARCHIVE && "$(cat "$ARCHIVE.stamp" 2>/dev/null)" == "$key" ]]; then
  echo "$NAME: $ARCHIVE is current (inputs $key)"; exit 0
fi
rm -f "$ARCHIVE.stamp"
mkdir -p "$(dirname "$ARCHIVE")"
entry="$IMAGE_CACHE/$NAME/$key.tar"
if [[ $IMAGE_CACHE != off && -f $entry ]]; then
  # A hard link where the two folders share a file system; a copy otherwise.
  ln -f "$entry" "$ARCHIVE.tmp" 2>/dev/null || cp "$entry" "$ARCHIVE.tmp"
  mv -f "$ARCHIVE.tmp" "$ARCHIVE"
  echo "$key" >"$ARCHIVE.stamp"
  echo "$NAME: $ARCHIVE from the per-user cache (inputs $key)"; exit 0
fi
KE_SAVE_IMAGES="$ARCHIVE" nice -n 19 "$ROOT/hack/images.sh" "src-$key" "${ROLES[@]}"
echo "$key" >"$ARCHIVE.stamp"
if [[ $IMAGE_CACHE != off ]] && mkdir -p "$IMAGE_CACHE/$NAME"; then
  # One entry per name, the newest; written whole or not at all.
  if ln -f "$ARCHIVE" "$entry.tmp" 2>/dev/null || cp "$ARCHIVE" "$entry.tmp"; then
    mv -f "$entry.tmp" "$entry"
    find "$IMAGE_CACHE/$NAME" -maxdepth 1 -name '*.tar' ! -name "$key.tar" -delete
  else
    rm -f "$entry.tmp"; echo "$NAME: could not store the archive in $IMAGE_CACHE (ignored)" >&2
  fi
fi
echo "$NAME: built $ARCHIVE (inputs $key)"
