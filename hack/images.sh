#!/usr/bin/env bash
# Build the per-role images, tagged by git sha (never `latest`).   Run by `make images` as: hack/images.sh <git-sha>
#
#   hack/images.sh <tag> [role...]      roles: receiver dispatcher controller spark (default: all that exist)
#
# Order: the OS bases (hack/base-image.sh, unless given), then images/base/Dockerfile once per role with ROLE=<role> —
# kafka-eventing-<role>-base:<tag> (the package and [project].dependencies + the role's extra, UID 65532; for spark
# on a JRE base, UID 185) — then each role's Dockerfile `FROM` its base (labels, ENTRYPOINT; spark adds the
# connector jars and its entrypoint script).
#
# Engine: DOCKER_HOST when it answers; otherwise a private dockerd whose data, exec root and socket live under
# $KE_CACHE/docker (bridge/iptables off, so it needs no host networking set-up). A private engine this script
# started is stopped on exit unless KE_KEEP_DOCKERD=1; one already running there is reused and left running.
# Use the system engine explicitly with DOCKER_HOST=unix:///var/run/docker.sock.
#
#   BASE_IMAGE       OS base of the role bases (default: `hack/base-image.sh` builds Debian bookworm + python3
#                    from the Debian archive, because this machine reaches no registry). Users with registry
#                    access pass BASE_IMAGE=python:3.11-slim-bookworm, images/base/Dockerfile's own default.
#   BUILDER_IMAGE    BASE_IMAGE + binutils, where the venv's shared objects are stripped (default: `hack/base-image.sh
#                    build`; with a registry, python:3.11-bookworm for python:3.11-slim-bookworm)
#   JRE_BASE_IMAGE   OS base of kafka-eventing-spark-base: bookworm + python3 3.11 + openjdk-17-jre-headless + tini
#                    at /usr/bin/tini, JAVA_HOME at /usr/lib/jvm/java-17 (default: `hack/base-image.sh jre`)
#   IMAGE_PREFIX     repository prefix (default kafka-eventing-) → kafka-eventing-receiver:<tag>
#   PREFETCH_WHEELS  1: download the wheels on the host into build/wheelhouse and build with --network none
#                    (default 1 with the private engine, 0 with DOCKER_HOST). The spark base always installs from
#                    build/spark-wheelhouse: pyspark is published as a source archive only, the builder takes wheels.
#   WITH_MSK_IAM     true (default): the spark image carries the AWS MSK IAM login module for Spark's Kafka client
#   BUILD_NETWORK    network of RUN steps (default with the private engine, which has no bridge: none with
#                    prefetched wheels, host without them; the engine's default otherwise)
#   PIP_INDEX_URL    passed to the builder stage when set
#   KE_SAVE_IMAGES   a file: `docker save` every role image built, and (with a service role) the OS base with curl
#                    that the chart's `helm test` Pod runs there (`hack/base-image.sh curl`), into it (one archive,
#                    shared layers once), for `ctr images import` into the cluster of `make cluster-up`
#   KE_IMAGE_CACHE   per-user cache (hack/image-cache.sh) of the OS bases and of each role base's dependency stages,
#                    keyed by their inputs: a fresh clone loads them instead of rebuilding; the package is always built
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DOCKER_DIR="${KE_CACHE:-$ROOT/.cache}/docker"
PRIVATE_SOCK="$DOCKER_DIR/docker.sock"
IMAGE_PREFIX="${IMAGE_PREFIX:-kafka-eventing-}"
ALL_ROLES=(receiver dispatcher controller spark)

log() { echo "images: $*" >&2; }

TAG="${1:-}"
[[ -n "$TAG" ]] || { echo "usage: hack/images.sh <tag> [role...]" >&2; exit 2; }
[[ "$TAG" != latest ]] || { log "refusing tag 'latest': images are tagged by git sha"; exit 2; }
shift
ROLES=("$@")
if [[ ${#ROLES[@]} -eq 0 ]]; then
  for role in "${ALL_ROLES[@]}"; do
    if [[ -f "$ROOT/images/$role/Dockerfile" ]]; then
      ROLES+=("$role")
    else
      log "skip $role: images/$role/Dockerfile not present"
    fi
  done
fi

engine_up() { docker version --format '{{.Server.Version}}' >/dev/null 2>&1; }

started_dockerd=""
stop_private_dockerd() {
  [[ -n "$started_dockerd" ]] || return 0
  log "stopping private dockerd (pid $started_dockerd)"
  kill -TERM "$started_dockerd" 2>/dev/null || true
  for _ in $(seq 1 150); do kill -0 "$started_dockerd" 2>/dev/null || return 0; sleep 0.2; done
  log "dockerd did not exit in 30s; killing it"
  kill -KILL "$started_dockerd" 2>/dev/null || true
}

private_engine=""
if [[ "${DOCKER_HOST:-}" == "unix://$PRIVATE_SOCK" ]] && engine_up; then
  log "using the private dockerd at $PRIVATE_SOCK"
  private_engine=1
elif [[ -n "${DOCKER_HOST:-}" ]] && engine_up; then
  log "using DOCKER_HOST=$DOCKER_HOST"
else
  [[ -z "${DOCKER_HOST:-}" ]] || log "DOCKER_HOST=$DOCKER_HOST does not answer; using a private dockerd"
  export DOCKER_HOST="unix://$PRIVATE_SOCK"
  private_engine=1
  if engine_up; then
    log "reusing the private dockerd at $PRIVATE_SOCK"
  else
    command -v dockerd >/dev/null || { log "no Docker engine: dockerd not found (apt-get install docker.io)"; exit 1; }
    [[ $EUID -eq 0 ]] || { log "no Docker engine reachable and a private dockerd needs root; set DOCKER_HOST"; exit 1; }
    mkdir -p "$DOCKER_DIR/data" "$DOCKER_DIR/exec"
    rm -f "$PRIVATE_SOCK"
    # setsid: the engine must not receive the terminal's Ctrl-C before this script has stopped it cleanly.
    setsid dockerd --data-root "$DOCKER_DIR/data" --exec-root "$DOCKER_DIR/exec" --host "$DOCKER_HOST" \
      --pidfile "$DOCKER_DIR/dockerd.pid" --bridge=none --iptables=false --ip6tables=false \
      >"$DOCKER_DIR/dockerd.log" 2>&1 </dev/null &
    started_dockerd=$!
    if [[ "${KE_KEEP_DOCKERD:-}" != 1 ]]; then trap stop_private_dockerd EXIT; fi
    for _ in $(seq 1 150); do
      engine_up && break
      if ! kill -0 "$started_dockerd" 2>/dev/null; then
        tail -n 20 "$DOCKER_DIR/dockerd.log" >&2
        log "dockerd exited"
        exit 1
      fi
      sleep 0.2
    done
    engine_up || { tail -n 20 "$DOCKER_DIR/dockerd.log" >&2; log "dockerd did not answer within 30s"; exit 1; }
    log "started private dockerd (pid $started_dockerd, log $DOCKER_DIR/dockerd.log)"
  fi
fi

base_roles=()   # roles built FROM kafka-eventing-<role>-base on BASE_IMAGE
want_spark=""
for role in "${ROLES[@]}"; do
  [[ "$role" != base ]] || { log "base is built for the roles that need it; name roles"; exit 2; }
  [[ -f "$ROOT/images/$role/Dockerfile" ]] || { log "images/$role/Dockerfile not found"; exit 1; }
  if [[ "$role" == spark ]]; then want_spark=1; else base_roles+=("$role"); fi
done

if [[ ${#base_roles[@]} -gt 0 && -z "${BASE_IMAGE:-}" ]]; then
  t0=$SECONDS
  BASE_IMAGE="$("$ROOT/hack/base-image.sh" py)"
  log "OS base $BASE_IMAGE ready in $((SECONDS - t0))s"
fi
if [[ -z "${BUILDER_IMAGE:-}" ]]; then
  t0=$SECONDS
  BUILDER_IMAGE="$("$ROOT/hack/base-image.sh" build)"
  log "OS builder base $BUILDER_IMAGE ready in $((SECONDS - t0))s"
fi
if [[ -n "$want_spark" && -z "${JRE_BASE_IMAGE:-}" ]]; then
  t0=$SECONDS
  JRE_BASE_IMAGE="$("$ROOT/hack/base-image.sh" jre)"
  log "OS base $JRE_BASE_IMAGE ready in $((SECONDS - t0))s"
fi

mkdir -p "$DOCKER_DIR"  # build logs
REVISION="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)"
SOURCE="${IMAGE_SOURCE:-https://github.com/kafka-eventing/kafka-eventing}"  # as charts/kafka-eventing/Chart.yaml
label_args=(--build-arg "REVISION=$REVISION" --build-arg "VERSION=$VERSION" --build-arg "SOURCE=$SOURCE")
base_args=(--build-arg "BUILDER_IMAGE=$BUILDER_IMAGE")
# The role bases' wheelhouse holds every service role's wheels, so that one wheelhouse serves each role's deps stage.
BASE_ROLE_EXTRAS=(receiver dispatcher controller)
[[ -z "${PIP_INDEX_URL:-}" ]] || base_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")

# Prefetch every wheel the images install (runtime dependencies pinned by the lock, plus setuptools for building this
# repo's wheel) with the host's pip and its configuration (index, proxy CA): the build itself then runs without
# network. On by default with the private engine, whose containers have no bridge and may not trust the host's CA.
# One wheelhouse per flavour, so that building one flavour never changes the other's deps layer:
# build/wheelhouse (role images) and build/spark-wheelhouse (the same plus the [spark] extra).
prefetch_wheels() {  # prefetch_wheels <dir under build/> [extra]
  local py="${PYTHON:-$ROOT/.venv/bin/python}" name="$1" extras="${2:-}" stamp t0=$SECONDS ok=1
  local wheelhouse="$ROOT/build/$1"
  [[ -x "$py" ]] || py=python3
  # Same lock, same pyproject, same interpreter: the wheels already there are the ones pip would pick again.
  stamp="$(cat "$ROOT/requirements.lock" "$ROOT/pyproject.toml" <("$py" -VV) <(echo "$extras") | sha256sum)"
  stamp="${stamp:0:16}"
  if [[ "$(cat "$wheelhouse/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    log "build/$name is current (stamp $stamp)"
    return
  fi
  rm -rf "$wheelhouse.tmp"
  mkdir -p "$wheelhouse.tmp"
  # Wheels are chosen for this interpreter and platform: it must be the images' Python (3.11 on Linux x86_64/arm64).
  requirements() {  # requirements <file> <extra...>: the runtime dependencies plus the named extras
    local file="$1"; shift
    "$py" -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + [d for e in sys.argv[2:] for d in p["optional-dependencies"][e]]))' \
      "$ROOT/pyproject.toml" "$@" >"$file"
  }
  requirements "$wheelhouse.tmp/runtime.in" "${BASE_ROLE_EXTRAS[@]}" || return 1
  # (Called in `||` lists, where set -e is off: every failure returns explicitly.)
  "$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --dest "$wheelhouse.tmp" \
    --constraint "$ROOT/requirements.lock" --requirement "$wheelhouse.tmp/runtime.in" "setuptools>=68" \
    || { log "pip download of the runtime dependencies failed (pip's error above)"; return 1; }
  # pyspark is published as a source archive only (its jars make it ~400 MB): `pip wheel` builds its pure-Python
  # wheel here on the host (pip caches it); everything else stays binary-only.
  if [[ -n "$extras" ]]; then
    if ! requirements "$wheelhouse.tmp/$extras.in" "$extras" || ! "$py" -m pip wheel --quiet --disable-pip-version-check --only-binary=:all: --no-binary=pyspark \
        --wheel-dir "$wheelhouse.tmp" --constraint "$ROOT/requirements.lock" \
        --requirement "$wheelhouse.tmp/$extras.in"; then
      log "the [$extras] extra does not resolve against requirements.lock (pip's error above)"
      ok=0
    fi
  fi
  rm -f "$wheelhouse.tmp"/*.in
  [[ $ok == 0 ]] || echo "$stamp" >"$wheelhouse.tmp/.stamp"
  rm -rf "$wheelhouse"
  mv "$wheelhouse.tmp" "$wheelhouse"
  log "prefetched $(find "$wheelhouse" -name '*.whl' | wc -l) wheels into build/$name in $((SECONDS - t0))s"
  [[ $ok == 1 ]]
}

# The spark image's jars, fetched on the host (build containers reach no Maven repository) into build/spark-jars:
# Spark's Kafka connector (hack/setup/maven.sh, the same as `make setup`) and, with WITH_MSK_IAM=true, the MSK IAM
# login module (images/spark/msk-iam-pom.xml). A library pyspark already ships (netty, httpclient, commons-codec in
# another version) is left out, so Spark's classpath holds one copy of each.
prefetch_spark_jars() {
  local py="${PYTHON:-$ROOT/.venv/bin/python}" out="$ROOT/build/spark-jars" cache="${KE_CACHE:-$ROOT/.cache}"
  local pom="$ROOT/images/spark/msk-iam-pom.xml" msk wheel t0=$SECONDS
  [[ -x "$py" ]] || py=python3
  local status
  status="$("$ROOT/hack/setup/maven.sh" spark-kafka)" || { log "Spark's Kafka connector: $status"; return 1; }
  local sources=("$cache"/spark-kafka-*/jars)
  if [[ "${WITH_MSK_IAM:-true}" == true ]]; then
    msk="$cache/spark-msk-iam/jars"
    if [[ "$(cat "$msk/.stamp" 2>/dev/null)" != "$(sha256sum "$pom" | cut -c1-16)" ]]; then
      command -v mvn >/dev/null || { log "mvn not found: install Maven (apt-get install maven)"; return 1; }
      rm -rf "$msk"; mkdir -p "$msk" "$cache/logs"
      mvn -B -q -s "$ROOT/hack/setup/maven/settings.xml" -f "$pom" \
        org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$msk" >"$cache/logs/maven-msk-iam.log" 2>&1 \
        || { tail -n 20 "$cache/logs/maven-msk-iam.log" >&2; log "MSK IAM jars: Maven failed"; return 1; }
      sha256sum "$pom" | cut -c1-16 >"$msk/.stamp"
    fi
    sources+=("$msk")
  fi
  wheel="$(find "$ROOT/build/spark-wheelhouse" -name 'pyspark-*.whl' | head -n1)"
  [[ -n "$wheel" ]] || { log "no pyspark wheel in build/spark-wheelhouse"; return 1; }
  rm -rf "$out"; mkdir -p "$out"
  # A jar is its Maven groupId:artifactId (META-INF/maven/*/*/pom.properties; the file name without the version
  # when it has none): the first source to bring an artifact wins, pyspark's own jars first.
  "$py" - "$wheel" "$out" "${sources[@]}" <<'PY'
import io, re, shutil, sys, zipfile
from pathlib import Path

def artifact(name: str, jar: zipfile.ZipFile) -> str:
    for entry in jar.namelist():
        if re.fullmatch(r"META-INF/maven/[^/]+/[^/]+/pom\.properties", entry):
            props = dict(l.split("=", 1) for l in jar.read(entry).decode().splitlines() if "=" in l)
            if "groupId" in props and "artifactId" in props:
                return f"{props['groupId'].strip()}:{props['artifactId'].strip()}"
    return re.sub(r"-\d[^/]*\.jar$", "", Path(name).name)

wheel, out, *sources = sys.argv[1:]
with zipfile.ZipFile(wheel) as whl:
    taken = {artifact(n, zipfile.ZipFile(io.BytesIO(whl.read(n))))
             for n in whl.namelist() if re.fullmatch(r"pyspark/jars/[^/]+\.jar", n)}
skipped = []
for source in sources:
    for path in sorted(Path(source).glob("*.jar")):
        with zipfile.ZipFile(path) as jar:
            key = artifact(path.name, jar)
        if key in taken:
            skipped.append(path.name)
            continue
        taken.add(key)
        shutil.copy2(path, out)
print(f"images: left out of build/spark-jars (pyspark ships them): {' '.join(skipped) or '-'}", file=sys.stderr)
PY
  log "staged $(find "$out" -name '*.jar' | wc -l) jars into build/spark-jars in $((SECONDS - t0))s"
}

PREFETCH_WHEELS="${PREFETCH_WHEELS:-${private_engine:-0}}"
if [[ "$PREFETCH_WHEELS" == 1 ]]; then
  if [[ ${#base_roles[@]} -gt 0 ]]; then prefetch_wheels wheelhouse || exit 1; fi
  base_args+=(--build-arg PIP_NO_INDEX=1)
else
  rm -rf "$ROOT/build/wheelhouse"  # stale wheels would shadow the index
fi
# The spark base always installs from its wheelhouse: pyspark has no wheel on PyPI, and the builder takes wheels
# only. A broken [spark] pin fails the spark image alone, after the role images are built.
spark_wheels_ok=1
if [[ -n "$want_spark" ]]; then prefetch_wheels spark-wheelhouse spark || spark_wheels_ok=0; fi

# Network of the base builds' RUN steps (the role Dockerfiles have none). The private engine has no bridge, so a
# build that downloads shares the host's network: only without prefetched wheels. An engine with a bridge keeps
# its default unless BUILD_NETWORK says otherwise.
if [[ -n "${BUILD_NETWORK:-}" ]]; then network="$BUILD_NETWORK"
elif [[ -z "$private_engine" ]]; then network=""
elif [[ "$PREFETCH_WHEELS" != 1 ]]; then network=host
else network=none
fi

results=()   # "image seconds status"
failed=0
# build <image> <dockerfile> <context> <build-arg...>
build() {
  local image="$1" dockerfile="$2" context="$3" t0=$SECONDS name
  shift 3
  name="$(basename "$(dirname "$dockerfile")")"
  [[ "$image" != *-base:* ]] || name="$(basename "${image%%:*}")"  # kafka-eventing-receiver-base
  log "building $image"
  # --force-rm: a failed RUN step leaves no stopped container behind (the classic builder keeps them otherwise).
  if docker build --force-rm ${network:+--network "$network"} "${label_args[@]}" "$@" -f "$dockerfile" -t "$image" \
      "$context" >"$DOCKER_DIR/build-$name.log" 2>&1; then
    log "built $image in $((SECONDS - t0))s"
    results+=("$image $((SECONDS - t0)) ok")
  else
    tail -n 30 "$DOCKER_DIR/build-$name.log" >&2
    log "build of $image FAILED after $((SECONDS - t0))s (full log: $DOCKER_DIR/build-$name.log)"
    results+=("$image $((SECONDS - t0)) FAILED")
    failed=1
    return 1
  fi
}
skip() { log "skip $1: $2"; results+=("$1 0 FAILED"); failed=1; }

# The per-user image cache (hack/image-cache.sh).
# shellcheck source=hack/image-cache.sh
source "$ROOT/hack/image-cache.sh"
# build_base <role> <image> <wheelhouse> <build-arg...>: images/base/Dockerfile for one role. Its stages up to
# `strip` (the venv of the locked dependencies, without this package) are fixed by the Dockerfile, slim_venv.py, the
# lock, pyproject.toml, the wheels, the OS bases and the build arguments, not by the commit: they are kept in the
# per-user cache as two images (targets venv and strip), keyed by a hash of exactly those, and given to the build
# as --cache-from, where the builder still checks every step against its own inputs. The stages that hold the
# package (build, runtime) are built from this tree every time.
build_base() {
  local role=$1 image=$2 wheelhouse=$3 key deps target t0=$SECONDS from=()
  shift 3
  key="$( { cat "$ROOT/images/base/Dockerfile" "$ROOT/images/base/slim_venv.py" "$ROOT/requirements.lock" \
              "$ROOT/pyproject.toml"
            if [[ -d "$ROOT/$wheelhouse" ]]; then
              (cd "$ROOT" && find "$wheelhouse" -type f ! -name .stamp -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
            fi
            docker image inspect --format '{{.Id}}' "$BASE_IMAGE_OF" "$BUILDER_IMAGE"
            printf '%s\n' "$role" "$network" "$@"
          } | sha256sum | cut -c1-16)"
  deps="${IMAGE_PREFIX}${role}-deps"
  # Earlier keys' stage images in this engine (a long-lived checkout's) are untagged: the engine keeps one set too.
  docker image ls --format '{{.Repository}}:{{.Tag}}' "$deps" | grep -v -- "-$key\$" | xargs -r docker image rm \
    >/dev/null 2>&1 || true
  if image_cache_load "$role-deps" "$key" "$deps:venv-$key" "$deps:strip-$key"; then
    log "cached: $role's dependency stages ($deps:{venv,strip}-$key, loaded in $((SECONDS - t0))s)"
    from=(--cache-from "$deps:venv-$key" --cache-from "$deps:strip-$key")
  fi
  build "$image" "$ROOT/images/base/Dockerfile" "$ROOT" "$@" "${from[@]}" || return 1
  if [[ ${#from[@]} -gt 0 ]]; then
    log "$image: $(grep -c 'Using cache' "$DOCKER_DIR/build-$(basename "${image%%:*}").log") steps from the cache"
    return 0
  fi
  # The two stage images of this build (from the engine's own cache, in a second), saved for the next clone.
  t0=$SECONDS
  for target in venv strip; do
    docker build --force-rm ${network:+--network "$network"} "${label_args[@]}" "$@" --target "$target" \
      -f "$ROOT/images/base/Dockerfile" -t "$deps:$target-$key" "$ROOT" >>"$DOCKER_DIR/build-$role-deps.log" 2>&1 \
      || { log "could not tag $role's $target stage (log: $DOCKER_DIR/build-$role-deps.log); not cached"; return 0; }
  done
  image_cache_store "$role-deps" "$key" "$deps:venv-$key" "$deps:strip-$key"
  log "cached $role's dependency stages for the next clone in $((SECONDS - t0))s"
}

# The bases' context is the repository root (filtered by .dockerignore); a role without COPY gets its own folder.
for role in "${base_roles[@]}"; do
  base="${IMAGE_PREFIX}${role}-base:${TAG}"
  if BASE_IMAGE_OF="$BASE_IMAGE" build_base "$role" "$base" build/wheelhouse --build-arg "BASE_IMAGE=$BASE_IMAGE" \
      --build-arg "ROLE=$role" "${base_args[@]}"; then
    build "${IMAGE_PREFIX}${role}:${TAG}" "$ROOT/images/$role/Dockerfile" "$ROOT/images/$role" \
      --build-arg "BASE=$base" || true
  else
    skip "${IMAGE_PREFIX}${role}:${TAG}" "$base failed"
  fi
done
if [[ -n "$want_spark" ]]; then
  spark_base="${IMAGE_PREFIX}spark-base:${TAG}"
  if [[ $spark_wheels_ok != 1 ]]; then
    skip "${IMAGE_PREFIX}spark:${TAG}" "the [spark] wheels could not be fetched"
  elif ! prefetch_spark_jars; then
    skip "${IMAGE_PREFIX}spark:${TAG}" "the spark jars could not be fetched"
  elif BASE_IMAGE_OF="$JRE_BASE_IMAGE" build_base spark "$spark_base" build/spark-wheelhouse \
      --build-arg "BASE_IMAGE=$JRE_BASE_IMAGE" \
      --build-arg ROLE=spark --build-arg "BUILDER_IMAGE=$BUILDER_IMAGE" \
      --build-arg APP_UID=185 --build-arg APP_USER=spark \
      --build-arg WHEELHOUSE=build/spark-wheelhouse --build-arg PIP_NO_INDEX=1 \
      ${PIP_INDEX_URL:+--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL"}; then
    build "${IMAGE_PREFIX}spark:${TAG}" "$ROOT/images/spark/Dockerfile" "$ROOT" --build-arg "BASE=$spark_base" || true
  else
    skip "${IMAGE_PREFIX}spark:${TAG}" "$spark_base failed"
  fi
fi

# Size is the whole image; a role image shares every layer of its role base. OVER OS BASE is what the role adds to
# the Python base it runs on (BASE_IMAGE, or JRE_BASE_IMAGE for spark): the per-role budget that
# tests/e2e/test_images.py holds the service roles to (80 MB).
printf '%-48s %10s %13s %8s\n' IMAGE SIZE 'OVER OS BASE' BUILD
mb() { awk -v s="$1" 'BEGIN { printf "%.1fMB", s / 1e6 }'; }
for result in "${results[@]}"; do
  read -r image seconds status <<<"$result"
  if [[ "$status" == ok ]]; then
    size="$(docker image inspect --format '{{.Size}}' "$image")"
    os_base="${BASE_IMAGE:-}"
    [[ "$image" != *spark* ]] || os_base="$JRE_BASE_IMAGE"
    over="$(( size - $(docker image inspect --format '{{.Size}}' "$os_base") ))"
    printf '%-48s %10s %13s %7ss\n' "$image" "$(mb "$size")" "$(mb "$over")" "$seconds"
  else
    printf '%-48s %10s %13s %7ss\n' "$image" FAILED - "$seconds"
  fi
done
[[ $failed == 0 ]] || exit 1
if [[ -n "${KE_SAVE_IMAGES:-}" ]]; then
  t0=$SECONDS
  saved=()
  for result in "${results[@]}"; do
    read -r image _ <<<"$result"
    [[ "$image" == *-base:* ]] || saved+=("$image")
  done
  # The `helm test` Pod's image goes with the service roles; a spark-only archive does without it.
  [[ ${#base_roles[@]} -eq 0 ]] || saved+=("$("$ROOT/hack/base-image.sh" curl)")
  mkdir -p "$(dirname "$KE_SAVE_IMAGES")"
  docker save -o "$KE_SAVE_IMAGES.tmp" "${saved[@]}"
  mv -f "$KE_SAVE_IMAGES.tmp" "$KE_SAVE_IMAGES"
  log "saved ${saved[*]} to $KE_SAVE_IMAGES ($(du -m "$KE_SAVE_IMAGES" | cut -f1) MB) in $((SECONDS - t0))s"
fi
