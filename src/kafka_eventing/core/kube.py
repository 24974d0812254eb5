"""The one way a role connects to the Kubernetes API: a kubeconfig file when one is given (``KE_KUBECONFIG``,
tests, the local stack), else the in-cluster service account."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client import ApiClient


def api_client(kubeconfig: Path | None, pool_size: int | None = None) -> ApiClient:
    """An ApiClient from ``kubeconfig`` or the in-cluster config. ``pool_size``: connections kept per host — the
    controller sizes it for its watches plus workers, so connections are reused rather than discarded."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    else:
        config.load_incluster_config(client_configuration=configuration)
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)
