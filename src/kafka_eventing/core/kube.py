"""The one way a role connects to the Kubernetes API: a kubeconfig file when one is given (``KE_KUBECONFIG``, else
the standard ``KUBECONFIG``; tests and the local stack set one), else the in-cluster service account."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kafka_eventing.core.settings import SettingsError

if TYPE_CHECKING:
    from kubernetes.client import ApiClient, Configuration

#: what to set, said whenever no API server can be found
HOW_TO_CONNECT = ("set KUBECONFIG (or KE_KUBECONFIG) to a kubeconfig file, or run in a pod with a service account "
                  "(KUBERNETES_SERVICE_HOST/PORT and /var/run/secrets/kubernetes.io/serviceaccount)")


class KubeConfigError(SettingsError):
    """No usable connection to the Kubernetes API; the message says what to set."""


def load_configuration(kubeconfig: Path | None) -> Configuration:
    """The client configuration from ``kubeconfig`` (a path, or a ``:``-separated list as ``KUBECONFIG`` allows)
    or the in-cluster config; :class:`KubeConfigError` when neither is usable."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except ConfigException as exc:
        if kubeconfig is not None:
            raise KubeConfigError(f"kubeconfig {kubeconfig} cannot be used ({exc}): {HOW_TO_CONNECT}") from None
        raise KubeConfigError(f"not in a cluster and no kubeconfig given: {HOW_TO_CONNECT}") from None
    return configuration


def api_client(kubeconfig: Path | None, pool_size: int | None = None) -> ApiClient:
    """An ApiClient from ``kubeconfig`` or the in-cluster config. ``pool_size``: connections kept per host — the
    controller sizes it for its watches plus workers, so connections are reused rather than discarded."""
    from kubernetes import client

    configuration = load_configuration(kubeconfig)
    if pool_size is not None:
        configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)
