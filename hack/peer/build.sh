#!/usr/bin/env bash
# Build Knative's own Kafka data plane (the Java/Vert.x receiver and dispatcher of eventing-kafka-broker) so the
# benchmarks can run it side by side with ours (bench/peer.py starts it).
#
# Why a source snapshot: this machine reaches package registries only, not GitHub, so the source cannot be cloned
# here. It comes from a snapshot of github.com/knative-extensions/eventing-kafka-broker made elsewhere (a bare git dir,
# e.g. what the session tool `fetch` leaves under /work/.mirror/, or any checkout). Maven dependencies come from
# Maven Central through the ordinary `mvn` client; the generated protobuf classes are committed upstream
# (data-plane/contract), so no protoc is needed.
#
#   KNATIVE_KAFKA_SRC  a bare git dir or a directory holding data-plane/ (required)
#   KNATIVE_KAFKA_REF  the ref to build when KNATIVE_KAFKA_SRC is a git dir (default knative-v1.20.3)
#   KE_CACHE           output root (default .cache) -> $KE_CACHE/peer/{receiver.jar,dispatcher.jar,config/,BUILD_INFO}
#   JAVA_HOME_PEER     a JDK >= 21 for the build (default /usr/lib/jvm/temurin-25-jdk-amd64; JAVA_HOME is left alone
#                      for the rest of the project, whose default JDK is 17)
#   PEER_FORCE=1       rebuild even if BUILD_INFO says this source was built already
#
# What is built: the receiver-loom and dispatcher-loom modules (the ones the release's hack/data-plane.sh publishes as
# the kafka-broker receiver/dispatcher images), shaded fat jars, with tests, license/jacoco/enforcer/spotless checks and jib
# image steps skipped. config/ gets the data-plane ConfigMap's properties files (producer, consumer, webclient,
# httpserver) and the kafka-config-logging logback config.xml of the same source, i.e. what a default install uses.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SRC="${KNATIVE_KAFKA_SRC:-}"
[[ -n "$SRC" && -d "$SRC" ]] || { echo "build.sh: set KNATIVE_KAFKA_SRC to a bare git dir or a checkout of eventing-kafka-broker" >&2; exit 2; }
REF="${KNATIVE_KAFKA_REF:-knative-v1.20.3}"
CACHE="${KE_CACHE:-.cache}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
OUT="$CACHE/peer"
export JAVA_HOME="${JAVA_HOME_PEER:-/usr/lib/jvm/temurin-25-jdk-amd64}"
[[ -x "$JAVA_HOME/bin/java" ]] || { echo "build.sh: no JDK at $JAVA_HOME (need Java 21+; set JAVA_HOME_PEER)" >&2; exit 2; }
MVN="${MVN:-mvn}"
mkdir -p "$OUT"

# -- identify the source ---------------------------------------------------------------------------------------
is_bare_git() { [[ -f "$1/HEAD" && -d "$1/objects" ]]; }
if is_bare_git "$SRC" || [[ -d "$SRC/.git" && ! -d "$SRC/data-plane" ]]; then
  GIT=(git --git-dir="$SRC"); [[ -d "$SRC/.git" ]] && GIT=(git --git-dir="$SRC/.git")
  COMMIT="$("${GIT[@]}" rev-parse --verify "$REF^{commit}")"
  SOURCE_ID="git:$COMMIT"
  SOURCE_DESC="$REF ($COMMIT)"
else
  [[ -d "$SRC/data-plane" ]] || { echo "build.sh: $SRC has no data-plane/" >&2; exit 2; }
  REF=""  # a directory is built as it is
  if git -C "$SRC" rev-parse HEAD >/dev/null 2>&1 && [[ -z "$(git -C "$SRC" status --porcelain -- data-plane proto)" ]]; then
    COMMIT="$(git -C "$SRC" rev-parse HEAD)"; SOURCE_ID="git:$COMMIT"; SOURCE_DESC="checkout $SRC ($COMMIT)"
  else
    COMMIT=""
    SOURCE_ID="tree:$(cd "$SRC" && find data-plane proto -type f -not -path '*/target/*' -print0 | sort -z \
      | xargs -0 sha256sum | sha256sum | cut -c1-40)"
    SOURCE_DESC="directory $SRC ($SOURCE_ID)"
  fi
fi

if [[ "${PEER_FORCE:-0}" != 1 && -f "$OUT/BUILD_INFO" && -f "$OUT/receiver.jar" && -f "$OUT/dispatcher.jar" ]] \
   && grep -qx "source_id=$SOURCE_ID" "$OUT/BUILD_INFO"; then
  echo "peer already built from $SOURCE_DESC: $OUT"
  exit 0
fi

# -- lay out the source tree -----------------------------------------------------------------------------------
ID="${SOURCE_ID#*:}"
WORK="$OUT/src/${ID:0:12}"
rm -rf "$WORK"; mkdir -p "$WORK"
LOGGING_YAML=control-plane/config/eventing-kafka-broker/200-controller/100-config-logging.yaml
if [[ "$SOURCE_ID" == git:* && -z "${GIT+x}" ]]; then GIT=(git -C "$SRC"); fi
if [[ "$SOURCE_ID" == git:* ]]; then
  "${GIT[@]}" archive "$COMMIT" data-plane proto "$LOGGING_YAML" | tar -x -C "$WORK"
else
  (cd "$SRC" && tar -c --exclude=target data-plane proto $( [[ -f "$LOGGING_YAML" ]] && echo "$LOGGING_YAML" )) | tar -x -C "$WORK"
fi

# The data-plane pom lists a snapshot repository besides Maven Central; this machine cannot reach it, so a
# settings file points it at an empty local directory (Maven Central stays the default, unnamed here).
SETTINGS="$OUT/maven-settings.xml"
mkdir -p "$OUT/no-repo"
cat > "$SETTINGS" <<EOF
<settings>
  <mirrors>
    <mirror><id>no-snapshots</id><mirrorOf>sonatype</mirrorOf><url>file://$OUT/no-repo</url></mirror>
  </mirrors>
</settings>
EOF

# -- build -----------------------------------------------------------------------------------------------------
MVN_ARGS=(-s "$SETTINGS" -B -ntp -Drelease -DskipTests -Dlicense.skip=true -Djacoco.skip=true -Dspotless.skip=true
  -Djib.skip=true -Denforcer.skip=true -pl receiver-loom,dispatcher-loom -am package)
echo "building peer from $SOURCE_DESC with $("$JAVA_HOME/bin/java" -version 2>&1 | head -1)"
start=$(date +%s)
(cd "$WORK/data-plane" && "$MVN" "${MVN_ARGS[@]}") > "$OUT/build.log" 2>&1 || {
  tail -40 "$OUT/build.log" >&2; echo "build.sh: maven failed, see $OUT/build.log" >&2; exit 1; }
secs=$(( $(date +%s) - start ))
cp "$WORK/data-plane/receiver-loom/target/receiver-loom-1.0-SNAPSHOT.jar" "$OUT/receiver.jar.tmp"
cp "$WORK/data-plane/dispatcher-loom/target/dispatcher-loom-1.0-SNAPSHOT.jar" "$OUT/dispatcher.jar.tmp"
mv "$OUT/receiver.jar.tmp" "$OUT/receiver.jar"
mv "$OUT/dispatcher.jar.tmp" "$OUT/dispatcher.jar"

# -- default configuration of the same source ------------------------------------------------------------------
# The data-plane ConfigMap's `data:` keys are two-space-indented `name: |` blocks whose lines are indented by four.
rm -rf "$OUT/config"; mkdir -p "$OUT/config"
extract_blocks() {  # $1 yaml file, $2 output dir, $3 key regex
  awk -v dir="$2" -v re="$3" '
    /^data:/ { indata = 1; next }
    indata && match($0, /^  [A-Za-z0-9._-]+: \|$/) {
      key = substr($0, 3, length($0) - 5); out = (key ~ re) ? dir "/" key : ""; next }
    indata && out != "" && ($0 ~ /^    / || $0 ~ /^$/) { sub(/^    /, ""); print > out; next }
    indata && $0 !~ /^    / && $0 !~ /^$/ { out = "" }
  ' "$1"
}
extract_blocks "$WORK/data-plane/config/broker/100-config-kafka-broker-data-plane.yaml" "$OUT/config" '^config-kafka-broker-.*\.properties$'
if [[ -f "$WORK/$LOGGING_YAML" ]]; then
  extract_blocks "$WORK/$LOGGING_YAML" "$OUT/config" '^config\.xml$'
  mv "$OUT/config/config.xml" "$OUT/config/logging.xml"
fi
for f in producer consumer webclient httpserver; do
  [[ -s "$OUT/config/config-kafka-broker-$f.properties" ]] || { echo "build.sh: no $f properties extracted" >&2; exit 1; }
done

# Target dirs are large (the shaded jars are copied out above); drop them.
rm -rf "$WORK"/data-plane/*/target

cat > "$OUT/BUILD_INFO" <<EOF
source_id=$SOURCE_ID
source=$SOURCE_DESC
ref=$REF
commit=$COMMIT
java=$("$JAVA_HOME/bin/java" -version 2>&1 | head -1)
maven=$("$MVN" -v 2>/dev/null | head -1 | sed "s/\x1b\[[0-9;]*m//g")
build_seconds=$secs
built_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
receiver_main=dev.knative.eventing.kafka.broker.receiverloom.Main
dispatcher_main=dev.knative.eventing.kafka.broker.dispatcherloom.Main
EOF
echo "peer built in ${secs}s from $SOURCE_DESC: $OUT/receiver.jar $OUT/dispatcher.jar"
