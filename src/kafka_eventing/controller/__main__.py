"""``python -m kafka_eventing.controller``."""

from kafka_eventing.controller.main import main

if __name__ == "__main__":
    main()
