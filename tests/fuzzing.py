"""Request strategies shared by the receiver's fuzz tests: the unit tier (falcon's test client, a fake producer)
and the integration tier (a real gunicorn in front of the real broker) send the same kinds of requests to the
channel ``shop/orders``."""

from __future__ import annotations

import json

from hypothesis import strategies as st

# Every answer the receiver may give; 5xx only as 503 (Kafka or the channel not ready), never a 500.
ALLOWED = {200, 202, 400, 404, 405, 413, 503}

# Header values as they arrive through WSGI: latin-1 text without control characters.
header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"),
                      max_size=40)
ce_names = st.sampled_from(["ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "ce-subject",
                            "ce-partitionkey", "ce-dataschema", "ce-x", "ce-Ünïcode", "content-type",
                            "traceparent", "tracestate", "ce-", "ce-datacontenttype"])
content_types = st.sampled_from(["application/json", "application/cloudevents+json",
                                 "application/cloudevents-batch+json", "text/plain", "", "application/xml"])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
attribute_maps = st.dictionaries(
    st.sampled_from(["specversion", "id", "source", "type", "time", "subject", "data", "data_base64",
                     "datacontenttype", "partitionkey", "x"]),
    json_values, max_size=8,
)
# Mostly-valid events (required attributes present), so the produce path is fuzzed too, not only parsing.
near_valid = st.fixed_dictionaries(
    {"specversion": st.sampled_from(["1.0", "1.0", "0.3", ""]), "id": st.text(min_size=1, max_size=10),
     "source": st.text(min_size=1, max_size=10), "type": st.text(min_size=1, max_size=10)},
    optional={"time": st.sampled_from(["2024-01-01T00:00:00Z", "yesterday", ""]), "data": json_values,
              "data_base64": st.text(max_size=10), "subject": json_values, "partitionkey": json_values,
              "datacontenttype": content_types, "x": json_values},
)
bodies = st.one_of(
    st.binary(max_size=300),
    attribute_maps.map(lambda d: json.dumps(d).encode()),
    near_valid.map(lambda d: json.dumps(d).encode()),
    st.lists(near_valid, max_size=3).map(lambda items: json.dumps(items).encode()),
)


random_requests = st.tuples(
    st.one_of(st.just({}), st.dictionaries(ce_names, header_text, max_size=8)), content_types, bodies,
    st.sampled_from(["POST", "POST", "POST", "GET", "OPTIONS", "PUT"]),
    st.sampled_from(["/", "/shop/orders", "/x", "/shop/orders/extra"]),
)
# Structured and batched requests to a known channel: these reach the produce path most of the time.
structured_requests = st.one_of(
    st.tuples(st.just({}), st.just("application/cloudevents+json"), near_valid.map(lambda d: json.dumps(d).encode()),
              st.just("POST"), st.just("/shop/orders")),
    st.tuples(st.just({}), st.just("application/cloudevents-batch+json"),
              st.lists(near_valid, max_size=3).map(lambda items: json.dumps(items).encode()),
              st.just("POST"), st.just("/shop/orders")),
)
