#!/usr/bin/env bash
# The Kafka broker image of `make test-kind`: hack/kind/kafka/Dockerfile on the Debian JRE base of
# hack/base-image.sh, with the Kafka jars `make setup` fetched (hack/setup/maven.sh kafka). Prints its tag; a tag the
# engine (DOCKER_HOST) already has is not rebuilt (the tag is a hash of every input).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${KE_CACHE:-$ROOT/.cache}"
VERSION="$(sed -n 's/^KAFKA_VERSION = "\(.*\)"/\1/p' "$ROOT/src/kafka_eventing/localstack/kafka.py")"
LIBS="$CACHE/kafka-$VERSION/libs"
log() { echo "kafka-image: $*" >&2; }
compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null || { log "no Kafka $VERSION jars in $LIBS: run make setup"; exit 1; }
BASE="${JRE_BASE_IMAGE:-$("$ROOT/hack/base-image.sh" jre)}"
hash="$( { ls -l "$LIBS"; cat "$ROOT"/hack/kind/kafka/*; echo "$BASE"; } | sha256sum | cut -c1-12)"
TAG="kafka-eventing-kind-kafka:$VERSION-$hash"
if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "cached: $TAG"
  echo "$TAG"
  exit 0
fi
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp -a "$ROOT"/hack/kind/kafka/. "$ctx/"
cp -a "$LIBS" "$ctx/libs"
docker build -q --network none --build-arg "BASE_IMAGE=$BASE" -t "$TAG" "$ctx" >/dev/null
log "built $TAG"
echo "$TAG"
