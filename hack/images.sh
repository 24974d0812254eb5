#!/usr/bin/env bash
# Build the per-role images, tagged by git sha (never `latest`).   Run by `make images` as: hack/images.sh <git-sha>
#
#   hack/images.sh <tag> [role...]      roles: receiver dispatcher controller spark (default: all that exist)
#
# Engine: DOCKER_HOST when it answers; otherwise a private dockerd whose data, exec root and socket live under
# $KE_CACHE/docker (bridge/iptables off, so it needs no host networking set-up). A private engine this script
# started is stopped on exit unless KE_KEEP_DOCKERD=1; one already running there is reused and left running.
# Use the system engine explicitly with DOCKER_HOST=unix:///var/run/docker.sock.
#
#   BASE_IMAGE       base for builder and runtime stages (default: hack/base-image.sh builds Debian bookworm +
#                    python3 from the Debian archive, because this machine reaches no registry). Users with
#                    registry access pass BASE_IMAGE=python:3.11-slim-bookworm, the Dockerfiles' own default.
#   IMAGE_PREFIX     repository prefix (default kafka-eventing-) → kafka-eventing-receiver:<tag>
#   PREFETCH_WHEELS  1: download the wheels on the host into build/wheelhouse and build with --network none
#                    (default 1 with the private engine, 0 with DOCKER_HOST)
#   BUILD_NETWORK    network of RUN steps (default with the private engine, which has no bridge: none with
#                    prefetched wheels, host for spark or without them; the engine's default otherwise)
#   PIP_INDEX_URL    passed to the builder stage when set
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

if [[ -z "${BASE_IMAGE:-}" ]]; then
  t0=$SECONDS
  BASE_IMAGE="$("$ROOT/hack/base-image.sh")"
  log "base image $BASE_IMAGE ready in $((SECONDS - t0))s"
fi

mkdir -p "$DOCKER_DIR"  # build logs
REVISION="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/pyproject.toml" | head -n1)"
SOURCE="${IMAGE_SOURCE:-https://github.com/kafka-eventing/kafka-eventing}"  # as charts/kafka-eventing/Chart.yaml
build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "REVISION=$REVISION" --build-arg "VERSION=$VERSION"
  --build-arg "SOURCE=$SOURCE")
[[ -z "${PIP_INDEX_URL:-}" ]] || build_args+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")

# Prefetch every wheel the images install (runtime dependencies pinned by the lock, plus setuptools for building this
# repo's wheel) with the host's pip and its configuration (index, proxy CA): the build itself then runs without
# network. On by default with the private engine, whose containers have no bridge and may not trust the host's CA.
prefetch_wheels() {
  local py="${PYTHON:-$ROOT/.venv/bin/python}" wheelhouse="$ROOT/build/wheelhouse" stamp t0=$SECONDS extras="" ok=1
  [[ -x "$py" ]] || py=python3
  # The spark image also installs the [spark] extra (pyspark alone is a ~400 MB wheel: only fetched when needed).
  [[ " ${ROLES[*]} " != *" spark "* ]] || extras=spark
  # Same lock, same pyproject, same interpreter: the wheels already there are the ones pip would pick again.
  stamp="$(cat "$ROOT/requirements.lock" "$ROOT/pyproject.toml" <("$py" -VV) <(echo "$extras") | sha256sum)"
  stamp="${stamp:0:16}"
  if [[ "$(cat "$wheelhouse/.stamp" 2>/dev/null)" == "$stamp" ]]; then
    log "build/wheelhouse is current (stamp $stamp)"
    return
  fi
  rm -rf "$wheelhouse.tmp"
  mkdir -p "$wheelhouse.tmp"
  # Wheels are chosen for this interpreter and platform: it must be the images' Python (3.11 on Linux x86_64/arm64).
  download() {  # download <label> <extra...>: the runtime dependencies plus the named extras, pinned by the lock
    local label="$1"; shift
    "$py" -c 'import sys, tomllib; p = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(p["dependencies"] + [d for e in sys.argv[2:] for d in p["optional-dependencies"][e]]))' \
      "$ROOT/pyproject.toml" "$@" >"$wheelhouse.tmp/$label.in"
    "$py" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --dest "$wheelhouse.tmp" \
      --constraint "$ROOT/requirements.lock" --requirement "$wheelhouse.tmp/$label.in" "setuptools>=68"
    rm -f "$wheelhouse.tmp/$label.in"
  }
  download runtime
  # A broken [spark] pin must not keep the role images from building: the spark build then fails on its own.
  if [[ -n "$extras" ]] && ! download "$extras" "$extras"; then
    log "WARNING: the [$extras] extra does not resolve against requirements.lock (pip's error above)"
    ok=0
  fi
  [[ $ok == 0 ]] || echo "$stamp" >"$wheelhouse.tmp/.stamp"
  rm -rf "$wheelhouse"
  mv "$wheelhouse.tmp" "$wheelhouse"
  log "prefetched $(find "$wheelhouse" -name '*.whl' | wc -l) wheels into build/wheelhouse in $((SECONDS - t0))s"
}

PREFETCH_WHEELS="${PREFETCH_WHEELS:-${private_engine:-0}}"
if [[ "$PREFETCH_WHEELS" == 1 ]]; then
  prefetch_wheels
  build_args+=(--build-arg PIP_NO_INDEX=1)
else
  rm -rf "$ROOT/build/wheelhouse"  # stale wheels would shadow the index
fi

# Network of a role's RUN steps. The private engine has no bridge, so anything that downloads during the build
# shares the host's network: the spark image always (apt and Maven fetch Java and the connector jars), the others
# only without prefetched wheels. An engine with a bridge keeps its default unless BUILD_NETWORK says otherwise.
network_for() {
  if [[ -n "${BUILD_NETWORK:-}" ]]; then echo "$BUILD_NETWORK"
  elif [[ -z "$private_engine" ]]; then echo ""
  elif [[ "$1" == spark || "$PREFETCH_WHEELS" != 1 ]]; then echo host
  else echo none
  fi
}

built=()
failed=()
for role in "${ROLES[@]}"; do
  dockerfile="$ROOT/images/$role/Dockerfile"
  [[ -f "$dockerfile" ]] || { log "images/$role/Dockerfile not found"; exit 1; }
  image="${IMAGE_PREFIX}${role}:${TAG}"
  t0=$SECONDS
  log "building $image"
  network="$(network_for "$role")"
  # The context is the repository root (filtered by .dockerignore): every role installs the same package.
  # --force-rm: a failed RUN step leaves no stopped container behind (the classic builder keeps them otherwise).
  if docker build --force-rm ${network:+--network "$network"} "${build_args[@]}" -f "$dockerfile" -t "$image" "$ROOT" \
      >"$DOCKER_DIR/build-$role.log" 2>&1; then
    log "built $image in $((SECONDS - t0))s"
    built+=("$image")
  else
    tail -n 30 "$DOCKER_DIR/build-$role.log" >&2
    log "build of $image FAILED after $((SECONDS - t0))s (full log: $DOCKER_DIR/build-$role.log)"
    failed+=("$image")
  fi
done

printf '%-48s %10s\n' IMAGE SIZE
for image in "${built[@]}"; do
  size="$(docker image inspect --format '{{.Size}}' "$image")"
  printf '%-48s %8.1fMB\n' "$image" "$(awk -v s="$size" 'BEGIN { print s / 1e6 }')"
done
for image in "${failed[@]}"; do printf '%-48s %10s\n' "$image" FAILED; done
[[ ${#failed[@]} -eq 0 ]]
