#!/usr/bin/env bash
# Fetch Java artifacts from Maven Central into the tool cache: the Kafka broker, or Spark's Kafka connector.
# Usage: maven.sh kafka|spark-kafka. Prints one status word; idempotent (stamp keyed on the POM's hash).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CACHE="${KE_CACHE:-$ROOT/.cache}"
HERE="$ROOT/hack/setup/maven"
case "$1" in
  kafka)       POM="$HERE/kafka-pom.xml";       OUT="$CACHE/kafka-3.9.1/libs"; FILTER="" ;;
  spark-kafka) POM="$HERE/spark-kafka-pom.xml"; OUT="$CACHE/spark-kafka-4.0.0/jars"
               # pyspark already ships Hadoop, lz4, snappy...: take only the connector's own jars.
               FILTER="-DincludeArtifactIds=spark-sql-kafka-0-10_2.13,spark-token-provider-kafka-0-10_2.13,kafka-clients,commons-pool2" ;;
  *) echo "usage: $0 kafka|spark-kafka" >&2; exit 2 ;;
esac
STAMP="$OUT/.stamp"
WANT="$(sha256sum "$POM" | cut -c1-16)"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && compgen -G "$OUT/*.jar" >/dev/null; then
  echo "ok (cached, $(ls "$OUT"/*.jar | wc -l) jars)"; exit 0
fi
command -v mvn >/dev/null || { echo "mvn not found: install Maven (apt-get install maven)"; exit 1; }
rm -rf "$OUT"; mkdir -p "$OUT" "$CACHE/logs"
LOG="$CACHE/logs/maven-$1.log"
# shellcheck disable=SC2086
if ! mvn -B -q -s "$HERE/settings.xml" -f "$POM" \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$OUT" $FILTER >"$LOG" 2>&1; then
  tail -20 "$LOG"; exit 1
fi
echo "$WANT" > "$STAMP"
echo "fetched $(ls "$OUT"/*.jar | wc -l) jars"
