# kafka-eventing — developer entry points. `make help` lists them.
ROOT      := $(abspath $(dir $(lastword $(MAKEFILE_LIST))))
# bash -o pipefail, printing each target's wall time after its recipe (one line per recipe): `[make] <target>: <s> s`.
SHELL = $(ROOT)/hack/make/bash --target=$@
.SHELLFLAGS = -ec
# When the outermost make started: the time after `test` and `e2e` is then the whole run's.
ifndef KE_MAKE_START
export KE_MAKE_START := $(shell date +%s)
endif
.DEFAULT_GOAL := help
export KE_CACHE ?= $(ROOT)/.cache
# Per-user cache of images fixed by their inputs (OS bases, the role bases' dependency stages, the kind node image),
# shared by every clone like Go's build cache (hack/image-cache.sh); `off` disables it.
export KE_IMAGE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kafka-eventing/images
VENV      := $(ROOT)/.venv
PY        := $(VENV)/bin/python
BIN       := $(KE_CACHE)/bin
export PATH := $(BIN):$(VENV)/bin:$(PATH)
# Every pytest tier lists its slowest tests and writes a JUnit report (hack/testing-doc.py counts its tests).
PYTEST    = $(PY) -m pytest --durations=10 --junitxml=$(KE_CACHE)/logs/junit/$@.xml
GIT_SHA   := $(shell git rev-parse --short HEAD 2>/dev/null || echo dev)

##@ General
.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Setup
.PHONY: setup
setup: ## Install what `make test` runs on (venv, Kafka, Spark connector, API server, Knative's controller, helm, ...) into .venv/.cache.
	@hack/setup.sh

.PHONY: setup-e2e
setup-e2e: ## Install what `make e2e` adds: node packages (containerd, docker.io, ...), kubelet, kube-scheduler, kubeadm, kube-proxy, CoreDNS, kind, wathola.
	@hack/setup.sh e2e

##@ Run
.PHONY: run
run: ## Main job: local Kafka + receiver + dispatcher + demo subscriber; stays up (ARGS=--exit-after-demo to stop).
	@hack/setup.sh python-run kafka && $(PY) -m kafka_eventing run $(ARGS)

.PHONY: local-up
local-up: ## Start a local Kafka node and Kubernetes API server on loopback (prints how to reach them); sets up only those.
	@hack/setup.sh python-run kafka && hack/setup/go-tools.sh etcd kube-apiserver kube-controller-manager kubectl \
	  && $(PY) -m kafka_eventing.localstack up

.PHONY: local-down
local-down: ## Stop what local-up started.
	$(PY) -m kafka_eventing.localstack down

.PHONY: cluster-images
cluster-images: ## The receiver, dispatcher and controller images saved for the cluster (no registry); built only when an input changes (hack/cluster-images.sh).
	@hack/cluster-images.sh roles

.PHONY: cluster-spark-image
cluster-spark-image: ## The spark image saved for the kind tier (no registry), in an archive of its own; built only when an input changes.
	@hack/cluster-images.sh spark

.PHONY: cluster-up
cluster-up: setup cluster-images ## One-node cluster with real pods (containerd + kubelet) in a network namespace with no route out.
	$(PY) -m kafka_eventing.localstack.cluster up

.PHONY: kind-image
kind-image: ## The kind node image from Debian packages and Go modules (no registry), on the kind engine; rebuilt only when an input changes.
	nice -n 19 $(PY) -m kafka_eventing.localstack.kind run -- hack/kind/node-image.sh

.PHONY: kind-down
kind-down: ## Stop the kind engine (after a crashed run); fails if anything (process, mount, cgroup) is left behind.
	$(PY) -m kafka_eventing.localstack.kind down

.PHONY: cluster-down
cluster-down: ## Stop what cluster-up started; fails if anything (process, mount, cgroup) is left behind.
	$(PY) -m kafka_eventing.localstack.cluster down

##@ Test
.PHONY: test
test: setup verify lint test-unit test-cesql test-integration test-reliability lint-charts ## Generated files current, lint, unit, CESQL conformance, integration on the real parts (Kafka, API server, Knative's controller, Spark), the short fault suite, chart checks.
	@echo "[make] test passed"

.PHONY: e2e
e2e: setup setup-e2e e2e-images test-cluster test-kind ## The chart on real pods (overlay, auth, leader kills, a killed supervisor) and on kind (the chart's scenarios, upgrade prober, Spark executor pods, ct install); needs root.
	@echo "[make] e2e passed"

.PHONY: e2e-images
e2e-images: cluster-images cluster-spark-image kind-image ## The images `make e2e` imports (nice'd; each built only when its inputs change). CI builds them beside `make test`.
	@echo "[make] e2e images ready"

.PHONY: test-unit
test-unit: ## Unit tests (fakes allowed), mirroring src/ (tests/unit/<role>/test_<module>.py); chart tests run in lint-charts.
	$(PYTEST) tests/unit -q -n 2

.PHONY: test-chart
test-chart: ## Render assertions and schema validation of every Helm scenario and Kustomize overlay (tests/chart).
	$(PYTEST) tests/chart -q

# The CloudEvents SQL conformance suite (cloudevents/spec cesql/cesql_tck, unchanged) and the two upstream files
# the unit tests also read.
CESQL_TCK ?= $(ROOT)/tests/cesql-tck $(ROOT)/tests/unit/cesql/tck

.PHONY: test-cesql
test-cesql: ## CloudEvents SQL conformance: every case of every TCK file in tests/cesql-tck (and tests/unit/cesql/tck).
	$(PY) -m kafka_eventing cesql tck $(CESQL_TCK)

.PHONY: test-integration
# Serial by default (0) until the tier passes under load on workers: with INTEGRATION_WORKERS=2 each pytest-xdist
# worker has a Kafka and an API server of its own, Spark's files (the longest lane) all run on one, first, and a file
# runs whole on one worker (tests/conftest.py); docs/testing.md has what it measured.
INTEGRATION_WORKERS ?= 0
test-integration: ## Integration tests on the real parts, on INTEGRATION_WORKERS pytest-xdist workers; docker/e2e tiers run with `make test-e2e`.
	KAFKA_EVENTING_REQUIRE_REAL_TIERS=1 $(PYTEST) tests/integration -q -m "not docker and not e2e" -n $(INTEGRATION_WORKERS)

.PHONY: test-reliability
test-reliability: ## The short fault suite (crashes, topic growth, rebalance; a few minutes) against the ledger.
	KAFKA_EVENTING_REQUIRE_REAL_TIERS=1 $(PYTEST) tests/reliability -q -m "reliability and not slow"

.PHONY: chaos
chaos: setup ## The whole fault suite with the 10-minute soak; writes docs/reliability.md (even when a scenario fails).
	KAFKA_EVENTING_REQUIRE_REAL_TIERS=1 RELIABILITY_REPORT=$(ROOT)/docs/reliability.md $(PYTEST) tests/reliability \
	  -v -m reliability $(ARGS)

.PHONY: test-cluster
test-cluster: cluster-images ## What kind cannot show, on a real kubelet: a killed cluster supervisor (test_cluster_crash.py, first: a cluster of its own), then on one shared cluster the overlay and the chart's auth and TLS (test_cluster.py) and leader kills (test_cluster_life.py); fails if a cluster cannot start.
	KAFKA_EVENTING_REQUIRE_REAL_TIERS=1 $(PYTEST) tests/e2e/test_cluster_crash.py tests/e2e/test_cluster.py \
	  tests/e2e/test_cluster_life.py -q -m cluster

.PHONY: test-kind
test-kind: cluster-images cluster-spark-image kind-image ## The chart on kind: helm install/upgrade/test/uninstall, the channel, Broker and KafkaSink/KafkaSource scenario, Knative's upgrade prober across upgrade and rollback, the reprocess jobs on executor pods, ct install (tests/e2e/test_kind*.py); fails, never skips.
	KAFKA_EVENTING_REQUIRE_REAL_TIERS=1 $(PYTEST) tests/e2e/test_kind.py tests/e2e/test_kind_crash.py -q -m kind

.PHONY: test-e2e
test-e2e: ## Whole-system tests that need a Docker engine (and kind).
	$(PYTEST) tests/e2e -q -m "docker or e2e"

.PHONY: lint
lint: ## ruff, mypy, import layers (roles import core, not each other), yamllint.
	$(PY) -m ruff check src tests bench hack images && $(PY) -m mypy && $(VENV)/bin/lint-imports --no-cache \
	  && $(PY) -m yamllint -c .yamllint.yaml .

.PHONY: lint-charts
lint-charts: ## helm lint, ct lint, helm-docs drift, schema validation of every render, render assertions.
	@PYTEST_ADDOPTS="--durations=10 --junitxml=$(KE_CACHE)/logs/junit/$@.xml" hack/lint-charts.sh

##@ Build
.PHONY: generate
generate: ## Write every generated file from its one source: the Kustomize base (from the chart), CRD copies, provider presets (values-*.yaml, overlays, ApplicationSets, docs), chart README.
	$(PY) hack/generate.py --helm $(BIN)/helm --helm-docs $(BIN)/helm-docs

.PHONY: verify
verify: generate ## Fail when `make generate` changes anything (a copy edited by hand, or a source changed without it).
	@new=$$(git ls-files --others --exclude-standard -- charts kustomize gitops docs); \
	if ! git diff --exit-code --stat || [ -n "$$new" ]; then \
	  echo "$$new"; echo "generated files differ from their sources: run \`make generate\` and commit the result" >&2; exit 1; fi

.PHONY: manifests
manifests: ## Render dist/install-<provider>.yaml from the Kustomize overlays.
	hack/manifests.sh

.PHONY: images
images: ## Build images/base, then every role image FROM it (needs a Docker engine), tagged with the git sha.
	hack/images.sh $(GIT_SHA)

##@ Benchmarks (results and plots under docs/benchmarks/)
.PHONY: bench-tools
OHA_VERSION := 1.16.0
GRANIAN_VERSION := 2.8.7
bench-tools: ## wrk (Debian) for saturation; oha (crates.io, built once into .cache) for open-loop latency; granian (PyPI), the compiled HTTP server bench-receiver measures.
	@{ command -v wrk >/dev/null || { apt-get update -qq && apt-get install -y -qq wrk >/dev/null; }; } \
	&& { $(PY) -c 'import granian' 2>/dev/null || $(PY) -m pip install -q granian==$(GRANIAN_VERSION); } \
	&& { test -x $(BIN)/oha && $(BIN)/oha --version | grep -q ' $(OHA_VERSION)' || { \
	  echo "building oha $(OHA_VERSION) with cargo (~10 min once)"; \
	  cargo install oha --locked --version $(OHA_VERSION) --root $(KE_CACHE)/cargo >$(KE_CACHE)/oha-build.log 2>&1 \
	    || { tail -20 $(KE_CACHE)/oha-build.log; exit 1; }; \
	  mkdir -p $(BIN) && ln -sf $(KE_CACHE)/cargo/bin/oha $(BIN)/oha; }; }

.PHONY: bench
bench: bench-receiver bench-dispatcher bench-e2e bench-controller bench-tracing bench-spark bench-cesql bench-broker bench-source ## All benchmarks.

.PHONY: bench-source
bench-source: setup ## KafkaSource: drain 1 KB plain and CloudEvent records to one subscriber, ours and the peer side by side.
	$(PY) bench/source.py

.PHONY: bench-receiver
bench-receiver: setup bench-tools ## Receiver vs bare falcon vs raw producer, side by side.
	$(PY) bench/receiver.py

.PHONY: bench-dispatcher
bench-dispatcher: setup ## Dispatcher vs bare HTTP client vs raw consumer; RSS under a large backlog.
	$(PY) bench/dispatcher.py

.PHONY: bench-e2e
bench-e2e: setup ## Receiver → Kafka → dispatcher → subscriber at 1,000 events/s, open loop; ours and the peer side by side.
	$(PY) bench/e2e.py

.PHONY: peer
peer: ## Build the peer the benchmarks compare with (Knative's Java data plane) from KNATIVE_KAFKA_SRC (hack/peer/README.md).
	hack/peer/build.sh

.PHONY: bench-controller
bench-controller: setup ## 500 KafkaChannels to Ready on the real apiserver + Kafka.
	$(PY) bench/controller.py

.PHONY: bench-tracing
bench-tracing: setup ## Cost of tracing per event on the receiver and dispatcher paths: off / on / unsampled.
	$(PY) bench/tracing.py

.PHONY: bench-spark
bench-spark: setup ## Archive/replay throughput at local[1] and local[2] vs a single-process baseline.
	$(PY) bench/spark.py

.PHONY: bench-cesql
bench-cesql: setup ## CESQL per-event evaluation vs a hand-written Python lambda, side by side; compile time.
	$(PY) bench/cesql.py

.PHONY: bench-broker
bench-broker: setup ## Kafka Broker vs a channel-based broker (ingress + filter hops), 10 Triggers, side by side.
	$(PY) bench/broker.py
