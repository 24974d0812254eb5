"""Shared pytest setup: real-part fixtures live in tests/fixtures/ and load as plugins."""

pytest_plugins = ["fixtures.kafka", "fixtures.kube"]
