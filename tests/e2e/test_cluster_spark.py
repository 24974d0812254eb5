"""The reprocessing jobs on Spark-on-Kubernetes executor pods of the real-pod cluster (`make test-cluster`): the
scenario of tests/e2e/_spark_pods.py, which test_kind.py runs on kind too — the chart's archive CronJob and replay Job
with ``reprocess.cluster`` on (their pod the driver, two executor pods from the project's Spark image, `make
cluster-spark-image`) produce exactly what the same jobs produce in local mode; an executor pod killed mid-archive
is replaced and the archive is still exact; an executor pod killed mid-replay loses no event and every duplicate is
one the manifest reports.

What is this tier's own: the cluster has no DNS, so ``reprocess.cluster.master`` names the ``kubernetes`` Service by
address; it has no Service routing either, so the executors reach the sink pod at its pod IP. The shared folder is
the host's, mounted into the pods (hostPath) of the one node, which runs on this machine.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import _netns_clients as clients
from e2e import _spark_pods as scenario
from e2e.test_cluster import Cluster, _image_roles
from kafka_eventing.localstack import cluster as kc

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(3600)]

#: `make cluster-spark-image`'s archive, imported into this module's cluster besides `make cluster-images`'.
SPARK_IMAGE = kc.workdir() / "spark" / "kafka-eventing-spark.tar"
#: The `kubernetes` Service by address: there is no cluster DNS to resolve kubernetes.default.svc.
MASTER = f"k8s://https://{kc.SERVICE_IP}:443"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if not SPARK_IMAGE.exists():
        pytest.fail(f"{SPARK_IMAGE} missing: run `make cluster-spark-image`")
    images = _image_roles()
    (images["spark"],) = kc.archive_refs([SPARK_IMAGE])
    try:
        state = kc.up(ttl=3600, extra_images=[SPARK_IMAGE])
    except kc.ClusterError as exc:
        kc.down()
        pytest.fail(f"the cluster did not start: {exc}")
    pool = multiprocessing.get_context("spawn").Pool(1, initializer=clients.init, initargs=(int(state["pid"]),))
    try:
        yield Cluster(state, images, pool)
    finally:
        pool.terminate()
        pool.join()
        kc.down()
        assert kc.leftovers() == [], "cluster-down left things behind"


@pytest.fixture
def tier(cluster: Cluster, tmp_path: Path) -> scenario.Tier:
    return scenario.Tier(cluster, cluster.images["spark"], cluster.images["receiver"],
                         cluster.state["bootstrap_servers"], MASTER, tmp_path,
                         lambda pod: f"http://{pod['status']['podIP']}:8080")


def test_archive_and_replay_on_executor_pods_match_local_mode(tier: scenario.Tier, spark: Any) -> None:
    scenario.archive_and_replay_match_local_mode(tier, spark)


def test_a_killed_executor_pod_is_replaced_and_the_archive_is_still_exact(tier: scenario.Tier, spark: Any) -> None:
    scenario.killed_executor_mid_archive(tier, spark)


def test_an_executor_pod_killed_mid_replay_loses_nothing_and_its_resends_are_in_the_manifest(
    tier: scenario.Tier,
) -> None:
    scenario.killed_executor_mid_replay(tier)
