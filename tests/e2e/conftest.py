"""The real-pod tier's one cluster (`make test-cluster`: tests/e2e/test_cluster.py and test_cluster_life.py).

``pod_cluster`` starts it when the first test asks for it — a session that runs none of them (kind's) never starts
it — and stops it at the session's end, checking that nothing is left behind. ``cluster`` is what a test takes: the
same cluster, checked after the test to be as the test found it (no Helm release, neither the system nor the app
namespace, none of the chart's or the overlay's cluster-wide objects); what a test left is removed, so the next test
starts clean, and that test's teardown fails naming it.

``kafka_eventing.localstack.cluster`` runs one cluster at a time (one state file; ``up`` hands back the one running).
tests/e2e/test_cluster_crash.py needs a cluster of its own, whose supervisor it SIGKILLs: were the shared one up, it
would be handed that one and kill it. So every test on the shared cluster runs after every other test of the
session (:func:`pytest_collection_modifyitems`), and a test marked ``usefixtures("cluster_of_its_own")`` fails at
once if it finds the shared cluster up.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest

from e2e import _netns_clients as clients
from e2e._pod_cluster import Cluster, clean_up, image_roles, left_behind
from kafka_eventing.localstack import cluster as kc

SHARED = "pod_cluster"
_SHARED_UP = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on the shared cluster last (a stable sort: each keeps its place among its kind), so that no other
    test runs while it is up."""
    items.sort(key=lambda item: SHARED in getattr(item, "fixturenames", ()))


@pytest.fixture(scope="session")
def pod_cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    images = image_roles()
    try:
        state = kc.up(ttl=3600)
    except kc.ClusterError as exc:
        kc.down()
        pytest.fail(f"the cluster did not start: {exc}")
    request.session.stash[_SHARED_UP] = True
    pool = multiprocessing.get_context("spawn").Pool(1, initializer=clients.init, initargs=(int(state["pid"]),))
    try:
        yield Cluster(state, images, pool)
    finally:
        pool.terminate()
        pool.join()
        kc.down()
        request.session.stash[_SHARED_UP] = False
        assert kc.leftovers() == [], "cluster-down left things behind"


@pytest.fixture
def cluster(pod_cluster: Cluster) -> Iterator[Cluster]:
    yield pod_cluster
    left = left_behind(pod_cluster)
    if left:
        clean_up(pod_cluster)
        pytest.fail(f"the test left {left} on the shared cluster (removed now, for the next test)")


@pytest.fixture
def cluster_of_its_own(request: pytest.FixtureRequest) -> None:
    """For a test that starts and breaks a cluster of its own: never while the shared one is up."""
    if request.session.stash.get(_SHARED_UP, False):
        pytest.fail("the shared real-pod cluster is up: `kc.up` would hand this test that cluster to break "
                    "(tests/e2e/conftest.py orders the tests so that this cannot happen; was the order changed?)")
