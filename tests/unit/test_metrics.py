"""core.metrics.Tally: buffered increments reach prometheus_client exactly as direct calls would."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from kafka_eventing.core.metrics import Tally

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = (0.0005, 0.001, 0.002, 0.01, 0.05, 0.5, 0.99, 1.0, 3.0, 0.0)


def _metrics() -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    counter = Counter("t_events_total", "events", ["code"], registry=registry)
    hist = Histogram("t_latency_seconds", "latency", buckets=BUCKETS, registry=registry)
    return registry, counter, hist


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for m in registry.collect() for s in m.samples if not s.name.endswith("_created")}


def test_tally_matches_direct_calls_and_waits_for_flush() -> None:
    direct, d_counter, d_hist = _metrics()
    buffered, b_counter, b_hist = _metrics()
    tally = Tally(interval=3600)
    for i, value in enumerate(VALUES):
        code = "202" if i % 3 else "503"
        d_counter.labels(code).inc()
        d_hist.observe(value)
        tally.inc(b_counter.labels(code))
        tally.observe(b_hist, value)
    d_counter.labels("202").inc(1024)
    tally.inc(b_counter.labels("202"), 1024)

    assert _samples(buffered)[("t_latency_seconds_count", ())] == 0  # nothing written before a flush
    tally.flush()
    assert _samples(buffered) == _samples(direct)
    assert b"t_latency_seconds_bucket{le=\"0.01\"} 5.0" in generate_latest(buffered)
    tally.flush()  # a second flush adds nothing
    assert _samples(buffered) == _samples(direct)


def test_flush_all_is_what_a_scrape_runs() -> None:
    registry, counter, _ = _metrics()
    tally = Tally(interval=3600)
    tally.inc(counter.labels("400"), 2)
    Tally.flush_all()
    assert _samples(registry)[("t_events_total", (("code", "400"),))] == 2
