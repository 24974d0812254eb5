#!/usr/bin/env bash
# The Debian packages `make cluster-up` runs (containerd, runc, the CNI plugins), builds images with (debootstrap,
# the Docker engine) and compiles its pause binary with (gcc, libc6-dev), and the kind tier's (jq: the kind engine's
# runc wrapper edits OCI specs with it; file: hack/kind/node-image.sh checks its binaries are static): installed by
# name from the Debian archive, only those missing. Prints one line.
set -euo pipefail
PACKAGES=(containerd runc containernetworking-plugins iproute2 util-linux debootstrap docker.io gcc libc6-dev jq file)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "ok (${#PACKAGES[@]} packages present)"
  exit 0
fi
[[ $EUID -eq 0 ]] || { echo "missing ${missing[*]}: run as root or apt-get install them"; exit 1; }
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "installed ${missing[*]}"
