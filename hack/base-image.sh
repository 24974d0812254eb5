#!/usr/bin/env bash
# Build a Debian bookworm + python3 (3.11) base image from Debian's archive alone — no container registry.
#
#   hack/base-image.sh            prints the tag of the base image, building it first if the engine lacks it
#
# The Dockerfiles default to python:3.11-slim-bookworm (what users pull); CI and tests pass this image as
# BASE_IMAGE instead, on machines that reach package archives but no registry. Both are bookworm with Python 3.11,
# so the cp311 manylinux wheels of requirements.lock (confluent-kafka bundles librdkafka) fit either.
#
# Needs root (debootstrap chroots) and a reachable Docker engine (DOCKER_HOST). Only the tag goes to stdout.
#   DEBIAN_MIRROR   archive to bootstrap from (default http://deb.debian.org/debian)
#   BASE_TAG        tag to give the image (default: derived from this script's content, so edits rebuild it)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KE_CACHE:-$ROOT/.cache}/docker"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# python3-venv brings ensurepip (pip + setuptools wheels) for the builder stage; ca-certificates lets librdkafka
# and httpx verify public CAs (Confluent Cloud, MSK, Event Hubs) without extra mounts.
PACKAGES=python3,python3-venv,ca-certificates

log() { echo "base-image: $*" >&2; }

digest="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
TAG="${BASE_TAG:-kafka-eventing-base:${SUITE}-py3-${digest}}"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "cached: $TAG"
  echo "$TAG"
  exit 0
fi

if [[ $EUID -ne 0 ]]; then
  log "debootstrap needs root to build $TAG; run as root or pass BASE_IMAGE=<an image you have>"
  exit 1
fi
command -v debootstrap >/dev/null || { log "debootstrap not found (apt-get install -y debootstrap)"; exit 1; }

mkdir -p "$CACHE"
rootfs="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
cleanup() {
  # debootstrap may leave /proc or /sys mounted in the target when it fails half-way.
  for m in proc sys dev/pts dev; do umount -l "$rootfs/$m" 2>/dev/null || true; done
  rm -rf --one-file-system "$rootfs"
}
trap cleanup EXIT

start=$SECONDS
log "debootstrap --variant=minbase $SUITE from $MIRROR (+ $PACKAGES)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >"$rootfs.log" 2>&1 || {
  tail -n 30 "$rootfs.log" >&2
  exit 1
}
rm -f "$rootfs.log"

# Every path below is inside the target; refuse to go on if the target is not the fresh bootstrap.
[[ -n "$rootfs" && "$rootfs" == "$CACHE"/rootfs.* && -x "$rootfs/usr/bin/python3" ]] || { log "bad rootfs '$rootfs'"; exit 1; }
# What an image needs no copy of: package caches and indexes, docs, man pages, foreign locales. As in Debian's
# slim images, dpkg skips them in later installs too, and the directories stay: maintainer scripts (openjdk's
# update-alternatives, in the spark image) create links in /usr/share/man/man1.
printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
  'path-exclude /usr/share/man/*' 'path-exclude /usr/share/info/*' \
  'path-exclude /usr/share/locale/*' 'path-include /usr/share/locale/locale.alias' \
  >"$rootfs/etc/dpkg/dpkg.cfg.d/slim"
rm -rf "${rootfs:?}"/var/cache/apt/* "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/log/* "${rootfs:?}"/tmp/*
find "${rootfs:?}/usr/share/doc" -type f ! -name copyright -delete
find "${rootfs:?}/usr/share/man" "${rootfs:?}/usr/share/info" -type f -delete
find "${rootfs:?}/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} +
# The host's resolver and hostname must not leak into the image; the engine mounts its own at run time.
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"
chmod 1777 "$rootfs/tmp"

python_version="$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
log "python3 in base: $python_version"

tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --change 'LABEL org.opencontainers.image.title="kafka-eventing-base"' \
  --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase + python3 $python_version (hack/base-image.sh)\"" \
  - "$TAG" >/dev/null
log "built $TAG in $((SECONDS - start))s"
echo "$TAG"
