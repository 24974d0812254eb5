"""`python -m kafka_eventing <command>` — same as the `kafka-eventing` console script."""

import sys

from kafka_eventing.cli import main

sys.exit(main())
