#!/usr/bin/env bash
# Build a Debian bookworm + python3 (3.11) OS image from Debian's archive alone — no container registry.
#
#   hack/base-image.sh [py|build|jre|curl]   prints the tag of the OS image, building it first if the engine lacks it
#
#   py   (default) python3, python3-venv, ca-certificates: the BASE_IMAGE of images/base (role images)
#   build  the same plus binutils: the BUILDER_IMAGE of images/base, whose `strip` takes the debug symbols out of
#        the wheels' shared objects (they never reach a runtime image, so the role images stay on `py`)
#   jre  the same plus openjdk-17-jre-headless (Spark 4 runs on Java 17) and tini: the BASE_IMAGE of the spark
#        image's base. Debian's JRE is installed here, on the host, because build containers have no network.
#
# images/base/Dockerfile defaults to python:3.11-slim-bookworm (what users pull); CI and tests pass this image as
# BASE_IMAGE instead, on machines that reach package archives but no registry. Both are bookworm with Python 3.11,
# so the cp311 manylinux wheels of requirements.lock (confluent-kafka bundles librdkafka) fit either.
#
# Needs root (debootstrap chroots) and a reachable Docker engine (DOCKER_HOST). Only the tag goes to stdout.
#   DEBIAN_MIRROR   archive to bootstrap from (default http://deb.debian.org/debian)
#   BASE_TAG        tag to give the image (default: derived from the flavour and this script's content, so edits
#                   rebuild it)
#   KE_IMAGE_CACHE  per-user cache of the built images (hack/image-cache.sh): a fresh clone loads them from there
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${KE_CACHE:-$ROOT/.cache}/docker"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# python3-venv brings ensurepip (pip + setuptools wheels) for the builder stage; ca-certificates lets librdkafka
# and httpx verify public CAs (Confluent Cloud, MSK, Event Hubs) without extra mounts.
PACKAGES=python3,python3-venv,ca-certificates
FLAVOUR="${1:-py}"
case "$FLAVOUR" in
  py)  NAME="${SUITE}-py3"; EXTRA_DESC="" ;;
  build) NAME="${SUITE}-py3-build"; EXTRA_DESC=" + binutils"; PACKAGES="$PACKAGES,binutils" ;;
  # tini: the Spark entrypoint's init (reaps the JVM's and Python workers' children, forwards signals).
  jre) NAME="${SUITE}-py3-jre17"; EXTRA_DESC=" + openjdk-17-jre-headless, tini"
       PACKAGES="$PACKAGES,openjdk-17-jre-headless,tini" ;;
  # curl: the image of the chart's `helm test` Pod on a cluster without registry access (make cluster-images).
  curl) NAME="${SUITE}-py3-curl"; EXTRA_DESC=" + curl"; PACKAGES="$PACKAGES,curl" ;;
  *) echo "usage: hack/base-image.sh [py|build|jre|curl]" >&2; exit 2 ;;
esac

log() { echo "base-image($FLAVOUR): $*" >&2; }

digest="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
# Not kafka-eventing-<role>-base: those names belong to images/base (this OS image + a role's venv).
TAG="${BASE_TAG:-kafka-eventing-debian:${NAME}-${digest}}"

if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "cached: $TAG"
  echo "$TAG"
  exit 0
fi
# The per-user cache (hack/image-cache.sh): the same script, flavour, archive (and its release) and tag make the same
# image.
# shellcheck source=hack/image-cache.sh
source "$ROOT/hack/image-cache.sh"
KEY="$(echo "$digest $FLAVOUR $MIRROR $(debian_release "$MIRROR" "$SUITE") $TAG" | sha256sum | cut -c1-16)"
start=$SECONDS
if image_cache_load "debian-$FLAVOUR" "$KEY" "$TAG"; then
  log "cached: $TAG (loaded from $IMAGE_CACHE in $((SECONDS - start))s)"
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
if [[ "$FLAVOUR" == jre ]]; then
  # Resolved inside the target: its links are absolute (/etc/alternatives/java -> /usr/lib/jvm/...).
  java="$(chroot "$rootfs" readlink -f /usr/bin/java)"
  [[ "$java" == /usr/lib/jvm/*/bin/java ]] || { log "no JRE under /usr/lib/jvm (java -> '$java')"; exit 1; }
  # A JAVA_HOME that does not name the architecture (java-17-openjdk-amd64 / -arm64).
  ln -s "${java%/bin/java}" "$rootfs/usr/lib/jvm/java-17"
  # The JVM finds libjli.so through $ORIGIN, which glibc reads from /proc/self/exe: mount /proc for the check.
  mount -t proc proc "$rootfs/proc"
  chroot "$rootfs" /usr/lib/jvm/java-17/bin/java -version 2>&1 | head -n1 | sed 's/^/base-image(jre): /' >&2
  umount "$rootfs/proc"
fi

python_version="$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
log "python3 in base: $python_version"

tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --change 'LABEL org.opencontainers.image.title="kafka-eventing-debian"' \
  --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase + python3 $python_version$EXTRA_DESC (hack/base-image.sh $FLAVOUR)\"" \
  - "$TAG" >/dev/null
log "built $TAG in $((SECONDS - start))s"
image_cache_store "debian-$FLAVOUR" "$KEY" "$TAG"
echo "$TAG"
