"""``python -m kafka_eventing.reprocess <job> ...`` (same as ``kafka-eventing reprocess``)."""

import sys

from kafka_eventing.reprocess.cli import main

raise SystemExit(main(sys.argv[1:]))
