# shellcheck shell=bash
# The per-user image cache, sourced by hack/base-image.sh, hack/images.sh and hack/kind/node-image.sh: `docker save`
# archives of images whose content is fixed by their inputs (the Debian OS bases, the role bases' dependency stages,
# the kind node image), kept outside the clone like Go's build cache, so a fresh clone (CI) loads them into its
# engine instead of rebuilding them. The archives the e2e tiers import, which hold this repository's source, are
# kept beside them by hack/cluster-images.sh, keyed by a hash of that source.
#
#   $KE_IMAGE_CACHE/<name>/<key>.tar   key: a hash of exactly the image's inputs, computed by the caller
#
#   KE_IMAGE_CACHE   the cache folder (default ${XDG_CACHE_HOME:-$HOME/.cache}/kafka-eventing/images); `off` uses none
#
# An entry is written to a temporary file and renamed, so a reader sees a whole archive or none; one that does not
# load is deleted and the image rebuilt. Each name keeps only its newest key: the size stays one archive per image.
IMAGE_CACHE="${KE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kafka-eventing/images}"

# debian_release <mirror> <suite>: the Date of the suite's Release file, which changes with every package set the
# archive serves for it (point releases): part of the key of any image debootstrap makes. "unknown" when the archive
# does not answer (debootstrap cannot run then either).
debian_release() {
  local date
  date="$(curl -fsSL --max-time 30 "$1/dists/$2/Release" 2>/dev/null | sed -n 's/^Date: //p' | head -n1)" || true
  echo "${date:-unknown}"
}

# image_cache_load <name> <key> <image...>: load the entry into the engine (DOCKER_HOST); fails on a miss, and on an
# entry that does not load or lacks one of the images (then deleted).
image_cache_load() {
  local name=$1 key=$2 entry
  shift 2
  entry="$IMAGE_CACHE/$name/$key.tar"
  [[ $IMAGE_CACHE != off && -f $entry ]] || return 1
  if docker load -q -i "$entry" >/dev/null 2>&1 && docker image inspect "$@" >/dev/null 2>&1; then return 0; fi
  echo "image-cache: $entry does not load (or lacks one of $*); deleting it, the image is rebuilt" >&2
  rm -f "$entry"
  return 1
}

# image_cache_store <name> <key> <image...>: save the images as the name's one entry. A failure (disk full) is
# reported and ignored: the images are built, only the next clone rebuilds them too.
image_cache_store() {
  local name=$1 key=$2 dir tmp
  shift 2
  [[ $IMAGE_CACHE != off ]] || return 0
  dir="$IMAGE_CACHE/$name"
  tmp="$dir/.$key.tar.$$"
  mkdir -p "$dir" || return 0
  if docker save -o "$tmp" "$@" && mv -f "$tmp" "$dir/$key.tar"; then
    # Older keys of this name, and temporary files a killed run left behind.
    find "$dir" -maxdepth 1 \( -name '*.tar' ! -name "$key.tar" -o -name '.*.tar.*' -mmin +120 \) -delete
    echo "image-cache: stored $name ($(du -m "$dir/$key.tar" | cut -f1) MB) in $dir" >&2
  else
    rm -f "$tmp"
    echo "image-cache: could not store $name in $dir (ignored)" >&2
  fi
}
