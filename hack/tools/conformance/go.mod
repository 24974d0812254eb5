// Builds the CloudEvents conformance tool (github.com/cloudevents/conformance/cmd/cloudevents: send, invoke, listen,
// diff) for tests/integration/test_conformance.py. Driven by hack/setup/go-tools.sh; its CE_CONFORMANCE_VERSION must
// equal the version here. To bump: `go get -tool github.com/cloudevents/conformance/cmd/cloudevents@vX && go mod
// tidy` in this directory, commit go.mod + go.sum.
module kafka-eventing/hack/tools/conformance

go 1.24.0

tool github.com/cloudevents/conformance/cmd/cloudevents

require (
	github.com/cloudevents/conformance v0.4.1 // indirect
	github.com/google/go-cmp v0.5.7 // indirect
	github.com/inconshreveable/mousetrap v1.0.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/spf13/cobra v1.3.0 // indirect
	github.com/spf13/pflag v1.0.5 // indirect
	golang.org/x/xerrors v0.0.0-20200804184101-5ec99f83aff1 // indirect
	gopkg.in/yaml.v2 v2.4.0 // indirect
)
