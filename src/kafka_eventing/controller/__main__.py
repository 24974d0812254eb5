"""``python -m kafka_eventing.controller``."""

import os

# One process with its own registry: its metrics stay in memory. The images set PROMETHEUS_MULTIPROC_DIR for the
# receiver's gunicorn workers; left set, prometheus_client (chosen at its import) would put the controller's
# metrics in files under a directory that nobody creates in the controller's pod.
os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)

from kafka_eventing.controller.main import main

if __name__ == "__main__":
    main()
