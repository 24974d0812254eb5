"""Real parts on loopback for people and tests: a Kafka KRaft node and a Kubernetes control plane.

Nothing here is mocked: the broker is Apache Kafka from Maven Central jars, the API server is the real
kube-apiserver built from Go modules (see ``make setup``).
"""
