#!/usr/bin/env bash
# make kind-image: a kind node image assembled from Debian packages and Go modules only (no container registry;
# `kind build node-image` cannot be used here: it pulls etcd, CoreDNS, pause and kindnetd, and kind's base image
# build downloads containerd, runc and the CNI plugins from GitHub).
#
#   python -m kafka_eventing.localstack.kind run -- hack/kind/node-image.sh     (what `make kind-image` runs)
#
# Prints the image's tag on stdout (also written to $KE_CACHE/kind/node-image.tag) and progress on stderr.
# DOCKER_HOST must be the kind engine (kafka_eventing.localstack.kind): its default runtime lets privileged
# containers start on this machine, and its data root keeps the image between runs.
#
# Steps, each cached in $KE_CACHE/kind (git-ignored) and redone only when its inputs change:
#   1. Debian bookworm minbase with the node's packages (debootstrap), beside
#   2. the static Kubernetes binaries (kubeadm, kubelet, kube-proxy, the control plane, etcd) and CoreDNS that
#      `make setup` builds (hack/setup/go-tools.sh, CGO_ENABLED=0): the same files the host tiers run; go-tools.sh is
#      called here only to check their stamps (and to build them when `make setup` has not);
#   3. kind's own base files from its Go module (the kind version `make setup` builds) and the settings of kind's base
#      Dockerfile, with three changes this machine needs: containerd's OOMScoreAdjust and oom_score_adj changes need
#      CAP_SYS_RESOURCE (dropped), the machine-wide sysctls the kubelet (localstack.cluster.KUBELET_SYSCTLS) and
#      systemd would write are bind-mounted over inside the node by an entrypoint run before kind's, and no sysctl.d
#      file but kind's network ones (namespaced) is applied at boot; a static bridge CNI (kindnetd cannot be built
#      from the module proxy: one node only);
#   4. the control-plane images kubeadm expects (`kubeadm config images list`): scratch + the static binary; kube-proxy
#      on the node's own Debian base (it runs iptables); pause from localstack.cluster's static C pause;
#   5. those images imported into the node's containerd (pinned, not unpacked) and the node committed as
#      kafka-eventing-kind-node:<kube version>-<hash of every input>; a run whose hash names an image the engine has
#      does nothing, and one whose hash has an entry in the per-user cache (KE_IMAGE_CACHE, hack/image-cache.sh)
#      loads it from there: a fresh clone builds nothing.
#   DEBIAN_MIRROR   archive to bootstrap from (default http://deb.debian.org/debian)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CACHE="${KE_CACHE:-$ROOT/.cache}"
WORK="$CACHE/kind"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
export GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:-} -buildvcs=false"
# systemd as PID 1, containerd + runc + CNI plugins from Debian, what kubelet/kubeadm/kube-proxy call, and jq (kind's
# OCI hook mount-product-files.sh needs it: without it every static pod fails to start).
PACKAGES=(systemd systemd-sysv dbus containerd runc containernetworking-plugins iproute2 iptables nftables kmod procps
  util-linux mount conntrack ethtool socat ca-certificates ebtables libseccomp2 pigz jq bash)
NODE_TOOLS=(kubeadm kubelet kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd coredns)
POD_SUBNET=10.244.0.0/16         # kind's default podSubnet; the static CNI serves the first /24 of it

log() { echo "kind-image: $*" >&2; }
setting() { sed -n "s/^$1=\([^ ]*\).*/\1/p" "$ROOT/hack/setup/go-tools.sh"; }
KIND_VERSION="$(setting KIND_VERSION)"
KUBE_VERSION="$(setting KUBE_VERSION)"
[[ -n $KIND_VERSION && -n $KUBE_VERSION ]] || { log "KIND_VERSION/KUBE_VERSION not found in hack/setup/go-tools.sh"; exit 1; }
[[ -n "${DOCKER_HOST:-}" ]] || { log "DOCKER_HOST unset: run through make kind-image"; exit 1; }
[[ $EUID -eq 0 ]] || { log "needs root (debootstrap)"; exit 1; }

# The kubelet's machine-wide sysctls, from the one list the real-pod tier uses too.
SYSCTLS="$(PYTHONPATH="$ROOT/src" "$PY" -c 'from kafka_eventing.localstack.cluster import KUBELET_SYSCTLS as s
print("\n".join(f"{k}={v}" for k, v in s.items()))')"
PAUSE_C="$(PYTHONPATH="$ROOT/src" "$PY" -c 'from kafka_eventing.localstack.cluster import _PAUSE_C; print(_PAUSE_C)')"

# shellcheck source=hack/image-cache.sh
source "$ROOT/hack/image-cache.sh"
RELEASE="$(debian_release "$MIRROR" bookworm)"  # the archive's package set, for the hash and the debootstrap stamp
hash_inputs() {
  { cat "${BASH_SOURCE[0]}" "$ROOT/hack/setup/go-tools.sh" "$ROOT"/hack/tools/kube/go.{mod,sum} \
      "$ROOT"/hack/tools/coredns/go.{mod,sum} "$ROOT"/hack/tools/kube/cmd/*/main.go
    echo "$KIND_VERSION $KUBE_VERSION ${PACKAGES[*]} $MIRROR $RELEASE $("$GO" version)"; echo "$SYSCTLS"; echo "$PAUSE_C"
  } | sha256sum | cut -c1-12
}
HASH="$(hash_inputs)"
TAG="kafka-eventing-kind-node:$KUBE_VERSION-$HASH"
mkdir -p "$WORK"
t_all=$SECONDS
if docker image inspect "$TAG" >/dev/null 2>&1; then
  log "cached: $TAG"
  echo "$TAG" >"$WORK/node-image.tag"
  echo "$TAG"
  exit 0
elif image_cache_load kind-node "$HASH" "$TAG"; then
  log "cached: $TAG (loaded from $IMAGE_CACHE in $((SECONDS - t_all))s)"
  echo "$TAG" >"$WORK/node-image.tag"
  echo "$TAG"
  exit 0
fi
log "building $TAG"

# ---- 1 + 2: debootstrap (network-bound) beside the Go builds (CPU-bound) ------------------------------------------
DEBOOTSTRAP="$WORK/debootstrap"
PKG_KEY="$(echo "${PACKAGES[*]} $MIRROR $RELEASE" | sha256sum | cut -c1-16)"
bootstrap() {
  if [[ -f $DEBOOTSTRAP/.stamp && "$(cat "$DEBOOTSTRAP/.stamp")" == "$PKG_KEY" ]]; then
    log "debootstrap: cached"
    return 0
  fi
  local t0=$SECONDS pkgs
  pkgs="$(IFS=,; echo "${PACKAGES[*]}")"
  rm -rf --one-file-system "$DEBOOTSTRAP"
  debootstrap --variant=minbase --include="$pkgs" bookworm "$DEBOOTSTRAP/root" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -n 30 "$WORK/debootstrap.log" >&2; return 1; }
  echo "$PKG_KEY" >"$DEBOOTSTRAP/.stamp"
  log "debootstrap: $((SECONDS - t0))s"
}
bootstrap &
bootstrap_pid=$!
t0=$SECONDS
KE_CACHE="$CACHE" nice -n 10 "$ROOT/hack/setup/go-tools.sh" "${NODE_TOOLS[@]}" >&2
log "Go builds: $((SECONDS - t0))s"
wait "$bootstrap_pid" || { log "debootstrap failed"; exit 1; }
BIN="$CACHE/bin"
for tool in "${NODE_TOOLS[@]}"; do
  # A static binary, or the scratch images cannot run it.
  if file "$BIN/$tool" | grep -q 'dynamically linked'; then log "$BIN/$tool is not static"; exit 1; fi
done

# ---- 3: the node's root filesystem ---------------------------------------------------------------------------------
t0=$SECONDS
R="$WORK/rootfs"
rm -rf --one-file-system "$R"
cp -a "$DEBOOTSTRAP/root" "$R"
KIND_SRC="$(cd "$ROOT/hack/tools/kube" && "$GO" mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | jq -r .Dir)"
FILES="$KIND_SRC/images/base/files"
[[ -d $FILES ]] || { log "kind's base files not found in $KIND_SRC"; exit 1; }
# As kind's base Dockerfile: scripts 0755, everything else 0644.
(cd "$FILES" && find . -type f) | while read -r f; do
  mode=0644
  [[ $f == ./usr/local/bin/* || $f == ./kind/bin/* ]] && mode=0755
  install -D -m "$mode" "$FILES/$f" "$R/${f#./}"
done
chmod 755 "$R/kind" "$R/kind/bin"
# kind's base Dockerfile: only the services kind wants, no kmsg in journald, systemd as /sbin/init.
find "$R/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
rm -f "$R"/lib/systemd/system/multi-user.target.wants/* "$R"/etc/systemd/system/*.wants/* \
  "$R"/lib/systemd/system/local-fs.target.wants/* "$R"/lib/systemd/system/sockets.target.wants/*udev* \
  "$R"/lib/systemd/system/sockets.target.wants/*initctl* "$R"/lib/systemd/system/basic.target.wants/*
echo "ReadKMsg=no" >>"$R/etc/systemd/journald.conf"
ln -sf /usr/lib/systemd/systemd "$R/sbin/init"
chroot "$R" systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
chroot "$R" systemctl mask systemd-binfmt.service >/dev/null 2>&1
mkdir -p "$R/etc/kubernetes/manifests"
# kind's base image installs containerd, its shim and ctr in /usr/local/bin and the CNI plugins in /opt/cni/bin; the
# node uses Debian's.
for b in containerd ctr containerd-shim-runc-v2; do ln -sf "/usr/bin/$b" "$R/usr/local/bin/$b"; done
mkdir -p "$R/opt/cni"
ln -sfn /usr/lib/cni "$R/opt/cni/bin"
for b in kubeadm kubelet kubectl; do install -m 0755 "$BIN/$b" "$R/usr/bin/$b"; done
echo "$KUBE_VERSION" >"$R/kind/version"
# CAP_SYS_RESOURCE is missing: containerd may not lower its own oom_score_adj, nor its containers'.
sed -i '/^OOMScoreAdjust=/d' "$R/etc/systemd/system/containerd.service"
sed -i 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' "$R/etc/containerd/config.toml"
grep -q 'restrict_oom_score_adj = true' "$R/etc/containerd/config.toml" || { log "kind's containerd config changed"; exit 1; }
# kind's base runtime spec: its OCI hook added, no rlimits.
chroot "$R" ctr oci spec \
  | jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' \
  | jq 'del(.process.rlimits)' >"$R/etc/containerd/cri-base.json"
# Boot-time sysctls: only kind's (net.*, namespaced). Debian's sysctl.d files set kernel.pid_max, fs.protected_* and
# others that are machine-wide.
rm -f "$R"/usr/lib/sysctl.d/*.conf "$R"/etc/sysctl.d/99-sysctl.conf
# Machine-wide sysctls the node would change: the kubelet's (set to its values) and the ones systemd raises as PID 1
# (fs.file-max, fs.nr_open, kept at the host's). Before kind's entrypoint starts systemd, each becomes a file bind-
# mounted over its /proc/sys entry inside the node, holding that value: writes land in the file.
cat >"$R/kind/bin/kafka-eventing-entrypoint" <<EOF
#!/bin/sh
# The node image's entrypoint (hack/kind/node-image.sh): pins machine-wide sysctls inside the node, then runs kind's.
set -eu
mkdir -p /run/kafka-eventing-sysctl
pin() {
  file=/run/kafka-eventing-sysctl/\$(echo "\$1" | tr / .)
  echo "\$2" >"\$file"
  mount --bind "\$file" "/proc/sys/\$1"
}
for kv in $(echo "$SYSCTLS" | tr '\n' ' '); do
  key=\${kv%%=*} value=\${kv#*=}
  [ "\$(cat "/proc/sys/\$key")" = "\$value" ] || pin "\$key" "\$value"
done
for key in fs/file-max fs/nr_open; do pin "\$key" "\$(cat "/proc/sys/\$key")"; done
exec /usr/local/bin/entrypoint "\$@"
EOF
chmod 0755 "$R/kind/bin/kafka-eventing-entrypoint"
# kindnetd is not served by the module proxy: a static bridge on the node, with the node's first pod /24.
mkdir -p "$R/etc/cni/net.d"
cat >"$R/etc/cni/net.d/10-kafka-eventing-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "kafka-eventing-bridge",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "${POD_SUBNET%.0.0/16}.0.0/24"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
: >"$R/etc/resolv.conf"
: >"$R/etc/hostname"
rm -rf "${R:?}"/var/cache/apt/* "${R:?}"/var/lib/apt/lists/* "${R:?}"/var/log/*.log "${R:?}"/usr/share/doc \
  "${R:?}"/usr/share/man "${R:?}"/usr/share/info
log "root filesystem: $((SECONDS - t0))s"

t0=$SECONDS
BASE="kafka-eventing-kind-base:$HASH"
tar --numeric-owner -C "$R" -c . | docker import \
  --change 'ENV container=docker' \
  --change 'ENTRYPOINT ["/kind/bin/kafka-eventing-entrypoint", "/sbin/init"]' - "$BASE" >/dev/null
rm -rf --one-file-system "$R"
log "imported $BASE: $((SECONDS - t0))s"

# ---- 4: the images kubeadm expects ---------------------------------------------------------------------------------
t0=$SECONDS
IMAGES="$WORK/images"
rm -rf "$IMAGES"
mkdir -p "$IMAGES"
mapfile -t WANTED < <("$BIN/kubeadm" config images list --kubernetes-version "$KUBE_VERSION" 2>/dev/null)
[[ ${#WANTED[@]} -ge 6 ]] || { log "kubeadm config images list gave: ${WANTED[*]}"; exit 1; }
image_for() { printf '%s\n' "${WANTED[@]}" | grep -E "^registry\.k8s\.io/(.*/)?$1:" | head -n1; }
# image REF FROM BINARY [USER]: REF = FROM + BINARY in /usr/local/bin (on PATH for kubeadm's static pods' commands).
image() {
  local ref=$1 from=$2 binary=$3 ctx
  ctx="$IMAGES/ctx-$binary"
  mkdir -p "$ctx"
  ln -f "$BIN/$binary" "$ctx/$binary"
  printf 'FROM %s\nCOPY %s /usr/local/bin/%s\nENTRYPOINT ["/usr/local/bin/%s"]\n' \
    "$from" "$binary" "$binary" "$binary" | docker build -q --network none -t "$ref" -f - "$ctx" >/dev/null
  rm -rf "$ctx"
}
refs=()
for component in kube-apiserver kube-controller-manager kube-scheduler etcd; do
  ref="$(image_for "$component")"
  image "$ref" scratch "$component"
  refs+=("$ref")
done
ref="$(image_for kube-proxy)"; image "$ref" "$BASE" kube-proxy; refs+=("$ref")
ref="$(image_for coredns)"
[[ $ref == *":$(setting COREDNS_VERSION)" ]] || { log "kubeadm wants $ref; set COREDNS_VERSION in go-tools.sh"; exit 1; }
image "$ref" scratch coredns
# CoreDNS's Deployment passes only arguments: the image's entrypoint is /coredns.
printf 'FROM %s\nENTRYPOINT ["/usr/local/bin/coredns"]\n' "$ref" | docker build -q --network none -t "$ref" - >/dev/null
refs+=("$ref")
PAUSE="$IMAGES/pause"
mkdir -p "$PAUSE"
PYTHONPATH="$ROOT/src" "$PY" -c 'import sys; from pathlib import Path
from kafka_eventing.localstack.cluster import PAUSE_IMAGE, pause_image
print(PAUSE_IMAGE); pause_image(Path(sys.argv[1]))' "$PAUSE" >"$PAUSE/ref"
docker load -q -i "$PAUSE/pause.tar" >/dev/null
# kind's containerd config names pause 3.10 as its sandbox image; kubeadm's list names its own.
for ref in "$(image_for pause)" registry.k8s.io/pause:3.10; do
  docker tag "$(cat "$PAUSE/ref")" "$ref"
  refs+=("$ref")
done
mapfile -t refs < <(printf '%s\n' "${refs[@]}" | sort -u)
log "images (${refs[*]}): $((SECONDS - t0))s"

# ---- 5: into the node's containerd, then commit --------------------------------------------------------------------
t0=$SECONDS
builder="kafka-eventing-kind-build-$HASH"
docker rm -f "$builder" >/dev/null 2>&1 || true
trap 'docker rm -f "$builder" >/dev/null 2>&1 || true' EXIT
docker run -d --privileged --network none --name "$builder" --entrypoint sleep "$BASE" infinity >/dev/null
docker exec -d "$builder" containerd
for _ in $(seq 1 100); do docker exec "$builder" ctr version >/dev/null 2>&1 && break; sleep 0.2; done
docker save "${refs[@]}" | docker exec -i "$builder" ctr -n k8s.io images import \
  --label=io.cri-containerd.pinned=pinned --no-unpack --digests - >/dev/null
listed="$(docker exec "$builder" ctr -n k8s.io images ls -q)"
for ref in "${refs[@]}"; do
  grep -qx "$ref" <<<"$listed" || { log "$ref missing from the node's containerd after import"; exit 1; }
done
docker exec "$builder" sh -c 'kill $(pidof containerd); while pidof containerd >/dev/null; do sleep 0.1; done'
docker commit --change 'ENTRYPOINT ["/kind/bin/kafka-eventing-entrypoint", "/sbin/init"]' --change 'CMD []' \
  --change 'ENV container=docker' "$builder" "$TAG" >/dev/null
docker rm -f "$builder" >/dev/null
# The control-plane images live on inside the node; the engine needs no copy of them.
docker image rm "${refs[@]}" "$(cat "$PAUSE/ref")" >/dev/null 2>&1 || true
old="$(cat "$WORK/node-image.tag" 2>/dev/null || true)"
if [[ -n $old && $old != "$TAG" ]]; then
  docker image rm "$old" "kafka-eventing-kind-base:${old##*-}" >/dev/null 2>&1 || true
fi
echo "$TAG" >"$WORK/node-image.tag"
log "node image: $((SECONDS - t0))s"
log "built $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" | awk '{printf "%.0f MB", $1/1e6}')) in $((SECONDS - t_all))s"
image_cache_store kind-node "$HASH" "$TAG"
echo "$TAG"
