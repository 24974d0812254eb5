#!/usr/bin/env bash
# Builds every Go-based tool the project uses from the Go module proxy (the only place these
# machines can get them from) into ${KE_CACHE:-<repo>/.cache}/bin.
#
#   hack/setup/go-tools.sh              # all tools
#   hack/setup/go-tools.sh test|e2e     # the tools `make test` / `make e2e` needs (the lists below)
#   hack/setup/go-tools.sh helm kubectl # only some
#
# Idempotent: each tool has a stamp keyed by its version and build inputs; a warm re-run only
# checks the stamp and runs the binary's version command. Build output goes to .cache/logs/.
set -euo pipefail

# ---- pinned versions -------------------------------------------------------------------------
HELM_VERSION=v3.22.0
CT_VERSION=v3.14.0          # chart-testing
KUSTOMIZE_VERSION=v5.8.2    # v5.8.3 needs go >= 1.27
KUBECONFORM_VERSION=v0.7.0
HELM_DOCS_VERSION=v1.14.2
KIND_VERSION=v0.33.0
# promtool (check metrics / check rules / test rules) from the Prometheus Go module, whose v0.X.Y tags are
# Prometheus 3.X.Y (v0.316.0 = Prometheus 3.16.0).
PROMETHEUS_VERSION=v0.316.0
# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kubectl, kubeadm, kube-proxy and etcd come from
# hack/tools/kube/go.mod; KUBE_VERSION must equal its k8s.io/kubernetes version (checked below). The newest 1.34 patch
# whose go.mod the checksum database serves here is v1.34.10 (v1.34.11/12 are not verifiable).
# To bump: set the new version in the replace block (every k8s.io staging module => v0.<minor>.<patch>),
# then in hack/tools/kube: `go get -tool k8s.io/kubernetes/cmd/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet}@vX
# && go mod tidy`, and commit go.mod + go.sum.
KUBE_VERSION=v1.34.10
# Knative Eventing's own controller (tests/integration/test_knative.py) from hack/tools/knative/go.mod, whose
# knative.dev/eventing version this must equal (checked below); its CRDs, roles and ConfigMaps come from the same
# module version (hack/setup/knative-config.sh reads it from that go.mod). The module's v0.X.Y is Knative 1.(X-27):
# v0.47.0 = Knative Eventing 1.20.0. The proxy refuses this module's version list, so `go install ...@version` fails;
# building inside a module that pins it needs no list. To bump: `go get -tool knative.dev/eventing/cmd/controller@vX`
# in hack/tools/knative, `go mod tidy`, commit go.mod + go.sum. The same module builds Knative's upgrade prober,
# wathola-sender/-receiver/-fetcher (test/test_images/wathola-*; tests/e2e/test_kind.py runs them as pods),
# static (CGO_ENABLED=0) so that a one-file image holds each.
KNATIVE_EVENTING_VERSION=v0.47.0
# A minimal OpenTelemetry Collector (the OTLP receiver and the file exporter; tests/integration/test_tracing.py) from
# hack/tools/otelcol (main.go + go.mod), whose go.opentelemetry.io/collector/otelcol version this must equal (checked
# below). Collector releases are v0.X.Y for the component modules and v1.(X-94).Y for the stable ones (pdata,
# confmap: v0.165.0 goes with v1.71.0); the contrib fileexporter carries the same v0.X.Y. Cold build (empty module
# and build caches, 2-core AMD EPYC VM): 80-93 s, downloads included; a warm re-run checks the stamp only.
OTELCOL_VERSION=v0.165.0
# The CloudEvents conformance tool (`cloudevents send|invoke|listen|diff`; tests/integration/test_conformance.py) from
# hack/tools/conformance/go.mod, whose github.com/cloudevents/conformance version this must equal (checked below).
# Upstream's own CLI, so the fidelity proof does not rest on code written here. It has no version flag.
CE_CONFORMANCE_VERSION=v0.4.1
# CoreDNS for the kind node image (hack/kind/node-image.sh) from hack/tools/coredns/go.mod, whose
# github.com/coredns/coredns version this must equal (checked below): the version `kubeadm config images list` names
# for KUBE_VERSION. To bump: `go get -tool github.com/coredns/coredns@vX && go mod tidy` in hack/tools/coredns.
COREDNS_VERSION=v1.12.1
# -----------------------------------------------------------------------------------------------

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE=${KE_CACHE:-$ROOT/.cache}
BIN=$CACHE/bin
LOGS=$CACHE/logs
STAMPS=$CACHE/stamps/go-tools
KUBE_MOD=$ROOT/hack/tools/kube
KNATIVE_MOD=$ROOT/hack/tools/knative
OTELCOL_MOD=$ROOT/hack/tools/otelcol
CONFORMANCE_MOD=$ROOT/hack/tools/conformance
COREDNS_MOD=$ROOT/hack/tools/coredns
CT_ETC=$ROOT/hack/ct/etc
mkdir -p "$BIN" "$LOGS" "$STAMPS"

GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
# Never fetch a toolchain: only the module proxy is reachable, and the pins fit the local Go.
export GOTOOLCHAIN=local
# Builds from a git work tree fail VCS stamping in some CI checkouts; the stamp adds nothing here.
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

FAILED=()

go_bin() {
  [[ -x $GO ]] || { echo "[go-tools] Go not found (set GO=/path/to/go or put go on PATH)" >&2; exit 1; }
}

hash_of() { cat "$@" | sha256sum | cut -c1-16; }

kube_inputs_hash() {
  hash_of "$KUBE_MOD/go.mod" "$KUBE_MOD/go.sum" "$KUBE_MOD"/cmd/*/main.go
}

# install_tool NAME VERSION STAMPKEY VERSION_ARGS BUILD_FUNCTION...
# Prints one line: "[go-tools] NAME VERSION ... ok (cached)" or "... built in Ns". VERSION_ARGS "@buildinfo:TEXT"
# checks the binary's Go build information for TEXT instead of running it (for tools that only serve or send).
tool_runs() {
  local bin=$1 vargs=$2
  if [[ $vargs == @buildinfo:* ]]; then
    go_bin
    "$GO" version -m "$bin" | grep -qF -- "${vargs#@buildinfo:}"
  else
    "$bin" $vargs
  fi
}

install_tool() {
  local name=$1 version=$2 key=$3 vargs=$4
  shift 4
  local bin=$BIN/$name stamp=$STAMPS/$name log=$LOGS/go-tools-$name.log
  printf '[go-tools] %s %s ... ' "$name" "$version"
  if [[ -x $bin && -f $stamp && "$(cat "$stamp")" == "$key" ]] \
    && tool_runs "$bin" "$vargs" >/dev/null 2>&1; then
    echo "ok (cached)"
    return 0
  fi
  go_bin
  local start=$SECONDS
  rm -f "$stamp"
  if "$@" >"$log" 2>&1 && tool_runs "$bin" "$vargs" >>"$log" 2>&1; then
    echo "$key" >"$stamp"
    echo "built in $((SECONDS - start))s"
  else
    echo "FAILED after $((SECONDS - start))s (log: $log)"
    tail -n 30 "$log" | sed 's/^/    /' >&2
    FAILED+=("$name")
  fi
}

# go install into BIN: for tools whose module has no replace directives.
go_install() {
  local ldflags=$1 pkg=$2
  GOBIN=$BIN "$GO" install -trimpath -ldflags "$ldflags" "$pkg"
}

# go build inside hack/tools/kube: the module that pins k8s.io/kubernetes with its staging replaces. Static
# (CGO_ENABLED=0), as upstream releases them: the kind node image (hack/kind/node-image.sh) runs these very binaries
# from scratch images, so Kubernetes is compiled once for the host tiers and the node (CGO_ENABLED changes the build
# of `net` and of everything above it, so a cgo build shares almost nothing in the Go build cache with a static one).
kube_build() {
  local out=$1 ldflags=$2 pkg=$3
  (cd "$KUBE_MOD" && CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg")
  mv -f "$out.tmp" "$out"
}

# go build inside hack/tools/knative: the module that pins knative.dev/eventing.
knative_build() {
  local out=$1 pkg=$2
  (cd "$KNATIVE_MOD" && "$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$out.tmp" "$pkg")
  mv -f "$out.tmp" "$out"
}

# The wathola tools: static, for one-file images (the prober of tests/e2e/test_kind.py).
build_wathola() {
  local name=$1
  (cd "$KNATIVE_MOD" && CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$BIN/$name.tmp" \
    "knative.dev/eventing/test/test_images/$name")
  mv -f "$BIN/$name.tmp" "$BIN/$name"
}

# go build inside hack/tools/otelcol: its own main.go with the components picked, as the collector's builder makes.
build_otelcol() {
  (cd "$OTELCOL_MOD" && "$GO" build -mod=readonly -trimpath -ldflags "-s -w -X main.version=$OTELCOL_VERSION" \
    -o "$BIN/otelcol.tmp" .)
  mv -f "$BIN/otelcol.tmp" "$BIN/otelcol"
}

# go build inside hack/tools/conformance: the module that pins github.com/cloudevents/conformance.
build_cloudevents() {
  (cd "$CONFORMANCE_MOD" && "$GO" build -mod=readonly -trimpath -ldflags "-s -w" -o "$BIN/cloudevents.tmp" \
    github.com/cloudevents/conformance/cmd/cloudevents)
  mv -f "$BIN/cloudevents.tmp" "$BIN/cloudevents"
}

helm_k8s_minor() {
  # Upstream's Makefile derives helm's default capability (the Kubernetes version `helm template`
  # assumes offline) from the client-go version helm is built with; do the same so templates
  # render as they would with a released helm binary instead of the v1.20 default.
  local mod
  mod=$("$GO" env GOMODCACHE)/cache/download/helm.sh/helm/v3/@v/$HELM_VERSION.mod
  [[ -f $mod ]] || "$GO" mod download -x "helm.sh/helm/v3@$HELM_VERSION" >/dev/null 2>&1
  awk '$1 == "k8s.io/client-go" { split($2, v, "."); print v[2]; exit }' "$mod"
}

build_helm() {
  local minor
  minor=$(helm_k8s_minor)
  [[ -n $minor ]] || { echo "could not read k8s.io/client-go version from helm's go.mod"; return 1; }
  local x=helm.sh/helm/v3
  go_install "-s -w -X $x/internal/version.version=$HELM_VERSION -X $x/internal/version.gitTreeState=clean \
    -X $x/pkg/chartutil.k8sVersionMajor=1 -X $x/pkg/chartutil.k8sVersionMinor=$minor \
    -X $x/pkg/lint/rules.k8sVersionMajor=1 -X $x/pkg/lint/rules.k8sVersionMinor=$minor" \
    "$x/cmd/helm@$HELM_VERSION"
}

build_ct() {
  # `go install ct@version` fails here: it lists the module's versions to check for deprecation and
  # the proxy refuses that list (403) for this module. Building inside the downloaded module is the
  # same build (its own go.mod/go.sum as the main module) without the list request.
  local mod=github.com/helm/chart-testing/v3
  "$GO" mod download "$mod@$CT_VERSION"
  (cd "$("$GO" env GOMODCACHE)/$mod@$CT_VERSION" && "$GO" build -mod=readonly -trimpath \
    -ldflags "-s -w -X $mod/ct/cmd.Version=$CT_VERSION" -o "$BIN/ct.tmp" ./ct)
  mv -f "$BIN/ct.tmp" "$BIN/ct"
  sync_ct_etc
}

# ct reads chart_schema.yaml and lintconf.yaml from CT_CONFIG_DIR; `go install` does not ship them,
# so the repo keeps copies (hack/ct/etc) taken from the pinned module.
sync_ct_etc() {
  local src f
  src=$("$GO" env GOMODCACHE)/github.com/helm/chart-testing/v3@$CT_VERSION/etc
  [[ -d $src ]] || "$GO" mod download "github.com/helm/chart-testing/v3@$CT_VERSION"
  mkdir -p "$CT_ETC"
  for f in chart_schema.yaml lintconf.yaml; do
    if ! cmp -s "$src/$f" "$CT_ETC/$f"; then
      install -m 0644 "$src/$f" "$CT_ETC/$f"
      echo "updated $CT_ETC/$f from chart-testing $CT_VERSION"
    fi
  done
}

build_kustomize() {
  go_install "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
}

build_kubeconform() {
  go_install "-s -w -X main.version=$KUBECONFORM_VERSION" \
    "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION"
}

build_helm_docs() {
  go_install "-s -w -X main.version=${HELM_DOCS_VERSION#v}" \
    "github.com/norwoodj/helm-docs/cmd/helm-docs@$HELM_DOCS_VERSION"
}

build_kind() {
  go_install "-s -w" "sigs.k8s.io/kind@$KIND_VERSION"
}

# Without Prometheus' service-discovery plugins (its own build tag, plugins/*.go): the checks used here (metrics, rules
# and their unit tests) read no scrape configuration, and the cloud SDKs behind the plugins are most of a cold build.
PROMTOOL_TAGS=remove_all_sd
build_promtool() {
  local n=${PROMETHEUS_VERSION#v0.} minor release
  minor=${n%%.*}
  release="$((minor / 100)).$((minor % 100)).${n#*.}"
  GOFLAGS="$GOFLAGS -tags=$PROMTOOL_TAGS" go_install "-s -w -X github.com/prometheus/common/version.Version=$release" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
}

kube_ldflags() {
  local minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  local p f=""
  # hack/lib/version.sh upstream stamps both packages; kubectl reports client-go's.
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "-s -w$f"
}

build_kube_apiserver() {
  kube_build "$BIN/kube-apiserver" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kube-apiserver
}
build_kube_controller_manager() {
  kube_build "$BIN/kube-controller-manager" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kube-controller-manager
}
# The node parts of `make cluster-up` (src/kafka_eventing/localstack/cluster.py): same module, same version stamp.
build_kube_scheduler() {
  kube_build "$BIN/kube-scheduler" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kube-scheduler
}
build_kubelet() {
  kube_build "$BIN/kubelet" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kubelet
}
build_kubectl() {
  kube_build "$BIN/kubectl" "$(kube_ldflags)" ./cmd/kubectl
}
# The rest of the kind node image (hack/kind/node-image.sh): kubeadm, kube-proxy and CoreDNS.
build_kubeadm() {
  kube_build "$BIN/kubeadm" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kubeadm
}
build_kube_proxy() {
  kube_build "$BIN/kube-proxy" "$(kube_ldflags)" k8s.io/kubernetes/cmd/kube-proxy
}
build_coredns() {
  (cd "$COREDNS_MOD" && CGO_ENABLED=0 "$GO" build -mod=readonly -trimpath \
    -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
    -o "$BIN/coredns.tmp" github.com/coredns/coredns)
  mv -f "$BIN/coredns.tmp" "$BIN/coredns"
}
build_etcd() {
  kube_build "$BIN/etcd" "-s -w" ./cmd/etcd
}

build_knative_eventing_controller() {
  knative_build "$BIN/knative-eventing-controller" knative.dev/eventing/cmd/controller
}

# check_pinned DIR MODULE WANT: the tool module in DIR pins MODULE at WANT (the version named above), or stop.
check_pinned() {
  local dir=$1 module=$2 want=$3 pinned
  pinned=$(awk -v m="$module" '$1 == m { print $2; exit }' "$dir/go.mod")
  if [[ $pinned != "$want" ]]; then
    echo "[go-tools] ${dir#"$ROOT"/}/go.mod has $module $pinned but the version set here is $want" >&2
    exit 1
  fi
}

# `test`: what the host tiers of `make test` run (lint-charts, integration: the API server, Knative's controller, the
# collector, the conformance tool). `e2e`: what only the pod and kind tiers of `make e2e` run.
TEST=(helm ct kustomize kubeconform helm-docs promtool kube-apiserver kube-controller-manager kubectl etcd
  knative-eventing-controller otelcol cloudevents)
E2E=(kind kube-scheduler kubelet kubeadm kube-proxy coredns wathola-sender wathola-receiver wathola-fetcher)
ALL=("${TEST[@]}" "${E2E[@]}")
WANT=()
for arg in "${@:-all}"; do
  case $arg in
    all) WANT+=("${ALL[@]}") ;;
    test) WANT+=("${TEST[@]}") ;;
    e2e) WANT+=("${E2E[@]}") ;;
    *) WANT+=("$arg") ;;
  esac
done

check_pinned "$KUBE_MOD" k8s.io/kubernetes "$KUBE_VERSION"
# etcd is built at the version kube-apiserver's own module requires.
ETCD_VERSION=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2; exit }' "$KUBE_MOD/go.mod")
KUBE_KEY="$KUBE_VERSION static $(kube_inputs_hash)"
check_pinned "$KNATIVE_MOD" knative.dev/eventing "$KNATIVE_EVENTING_VERSION"
KNATIVE_KEY="$KNATIVE_EVENTING_VERSION $(hash_of "$KNATIVE_MOD/go.mod" "$KNATIVE_MOD/go.sum")"
check_pinned "$OTELCOL_MOD" go.opentelemetry.io/collector/otelcol "$OTELCOL_VERSION"
OTELCOL_KEY="$OTELCOL_VERSION $(hash_of "$OTELCOL_MOD/go.mod" "$OTELCOL_MOD/go.sum" "$OTELCOL_MOD/main.go")"
check_pinned "$CONFORMANCE_MOD" github.com/cloudevents/conformance "$CE_CONFORMANCE_VERSION"
CONFORMANCE_KEY="$CE_CONFORMANCE_VERSION $(hash_of "$CONFORMANCE_MOD/go.mod" "$CONFORMANCE_MOD/go.sum")"
check_pinned "$COREDNS_MOD" github.com/coredns/coredns "$COREDNS_VERSION"
COREDNS_KEY="$COREDNS_VERSION static $(hash_of "$COREDNS_MOD/go.mod" "$COREDNS_MOD/go.sum")"

for tool in "${WANT[@]}"; do
  case $tool in
    helm) install_tool helm "$HELM_VERSION" "$HELM_VERSION" "version --short" build_helm ;;
    ct) install_tool ct "$CT_VERSION" "$CT_VERSION" "version" build_ct
        # ct's config files are checked even when the binary is cached.
        [[ -f $CT_ETC/chart_schema.yaml && -f $CT_ETC/lintconf.yaml ]] || { go_bin; sync_ct_etc; } ;;
    kustomize) install_tool kustomize "$KUSTOMIZE_VERSION" "$KUSTOMIZE_VERSION" "version" build_kustomize ;;
    kubeconform) install_tool kubeconform "$KUBECONFORM_VERSION" "$KUBECONFORM_VERSION" "-v" build_kubeconform ;;
    helm-docs) install_tool helm-docs "$HELM_DOCS_VERSION" "$HELM_DOCS_VERSION" "--version" build_helm_docs ;;
    kind) install_tool kind "$KIND_VERSION" "$KIND_VERSION" "version" build_kind ;;
    promtool) install_tool promtool "$PROMETHEUS_VERSION" "$PROMETHEUS_VERSION $PROMTOOL_TAGS" "--version" build_promtool ;;
    kube-apiserver) install_tool kube-apiserver "$KUBE_VERSION" "$KUBE_KEY" "--version" build_kube_apiserver ;;
    kube-controller-manager)
      install_tool kube-controller-manager "$KUBE_VERSION" "$KUBE_KEY" "--version" build_kube_controller_manager ;;
    kube-scheduler) install_tool kube-scheduler "$KUBE_VERSION" "$KUBE_KEY" "--version" build_kube_scheduler ;;
    kubelet) install_tool kubelet "$KUBE_VERSION" "$KUBE_KEY" "--version" build_kubelet ;;
    kubectl) install_tool kubectl "$KUBE_VERSION" "$KUBE_KEY" "version --client" build_kubectl ;;
    # No version flag: -h parses the flags and exits 0, which shows the binary starts.
    knative-eventing-controller) install_tool knative-eventing-controller "$KNATIVE_EVENTING_VERSION" "$KNATIVE_KEY" "-h" \
      build_knative_eventing_controller ;;
    # Knative's prober serves or sends until stopped: the build information shows the pinned module, linked static.
    wathola-sender|wathola-receiver|wathola-fetcher) install_tool "$tool" "$KNATIVE_EVENTING_VERSION" "$KNATIVE_KEY" \
      "@buildinfo:knative.dev/eventing	$KNATIVE_EVENTING_VERSION" build_wathola "$tool" ;;
    otelcol) install_tool otelcol "$OTELCOL_VERSION" "$OTELCOL_KEY" "--version" build_otelcol ;;
    # No version command: `help` runs cobra's root and exits 0.
    cloudevents) install_tool cloudevents "$CE_CONFORMANCE_VERSION" "$CONFORMANCE_KEY" "help" build_cloudevents ;;
    kubeadm) install_tool kubeadm "$KUBE_VERSION" "$KUBE_KEY" "version -o short" build_kubeadm ;;
    kube-proxy) install_tool kube-proxy "$KUBE_VERSION" "$KUBE_KEY" "--version" build_kube_proxy ;;
    coredns) install_tool coredns "$COREDNS_VERSION" "$COREDNS_KEY" "-version" build_coredns ;;
    etcd) install_tool etcd "$ETCD_VERSION" "$ETCD_VERSION $KUBE_KEY" "--version" build_etcd ;;
    *) echo "[go-tools] unknown tool '$tool' (known: ${ALL[*]})" >&2; exit 2 ;;
  esac
done

if [[ ${#FAILED[@]} -gt 0 ]]; then
  echo "[go-tools] failed: ${FAILED[*]} (logs in $LOGS)" >&2
  exit 1
fi
