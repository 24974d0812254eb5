"""Any valid CloudEvent, for property tests of the data plane: a hypothesis strategy, the request a sender of the
test's own makes of it (binary or structured mode, the HTTP binding written out by hand) and the reading of what a
subscriber got — nothing from the project's binding, so the checks do not grade the code with itself.

Used by tests/unit/core/test_fidelity.py (the binding and the fast paths) and tests/integration/test_conformance.py
(the real receiver, Kafka and dispatcher).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from hypothesis import assume
from hypothesis import strategies as st

CORE = {"id", "source", "specversion", "type", "time", "subject", "dataschema", "datacontenttype"}
HEADER_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in ('"', "%"))
TEXT = st.text(min_size=1, max_size=12)
CONTENT_TYPES = st.sampled_from([None, "application/json", "application/json; charset=utf-8", "text/plain",
                                  "application/octet-stream", "application/vnd.x+json", "text/json", "text/xml"])


@st.composite
def times(draw: st.DrawFn) -> str:
    date = draw(st.dates(min_value=dt.date(1, 1, 1), max_value=dt.date(9999, 12, 31)))
    clock = f"{draw(st.integers(0, 23)):02}:{draw(st.integers(0, 59)):02}:{draw(st.integers(0, 59)):02}"
    fraction = draw(st.one_of(st.just(""), st.from_regex(r"\A\.[0-9]{1,9}\Z")))
    zone = draw(st.one_of(st.sampled_from(["Z", "z", "+00:00", "-00:00"]),
                          st.builds(lambda s, h, m: f"{s}{h:02}:{m:02}", st.sampled_from("+-"),
                                    st.integers(0, 23), st.integers(0, 59))))
    # A zone that takes the instant past year 9999 or before year 1 is valid text but not a datetime.
    assume(not (date.year == 9999 and zone[0] == "-") and not (date.year == 1 and zone[0] == "+"))
    return f"{date.isoformat()}{draw(st.sampled_from('Tt'))}{clock}{fraction}{zone}"


@dataclass
class Event:
    attrs: dict[str, Any]  # str values; a structured sender's extension may be a JSON bool or int
    data: bytes | None
    json_data: str | None = None  # a structured sender's data member, as written

    def strings(self) -> dict[str, str]:
        return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in self.attrs.items()}


@st.composite
def events(draw: st.DrawFn, structured: bool) -> Event:
    attrs: dict[str, Any] = {"specversion": "1.0", "id": draw(TEXT), "source": draw(TEXT), "type": draw(TEXT)}
    for name, strategy in (("time", times()), ("subject", TEXT), ("dataschema", TEXT),
                           ("datacontenttype", CONTENT_TYPES)):
        value = draw(st.one_of(st.none(), strategy))
        if value is not None:
            attrs[name] = value
    values = st.one_of(TEXT, st.booleans(), st.integers(-2**31, 2**31 - 1)) if structured else TEXT
    names = st.from_regex(r"\A[a-z0-9]{1,20}\Z").filter(lambda n: n not in CORE and n != "data")
    attrs.update(draw(st.dictionaries(names, values, max_size=4)))
    ctype = attrs.get("datacontenttype")
    if not structured:
        return Event(attrs, draw(st.one_of(st.none(), st.binary(min_size=1, max_size=40))))
    is_json = ctype is None or "json" in ctype
    choice = draw(st.sampled_from(["none", "base64", "json" if is_json else "text"]))
    if choice == "none":
        return Event(attrs, None)
    if choice == "base64":
        return Event(attrs, draw(st.binary(min_size=1, max_size=40)))
    if choice == "text":
        text = draw(st.text(min_size=1, max_size=20))
        return Event(attrs, text.encode(), json.dumps(text, ensure_ascii=draw(st.booleans())))
    value = draw(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
                              lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                              max_leaves=6).filter(lambda v: v is not None))  # "data": null is no data
    text = json.dumps(value, ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 1])),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    return Event(attrs, text.encode(), text)


def request(event: Event, structured: bool) -> tuple[dict[str, str], bytes]:
    if structured:
        members = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in event.attrs.items()]
        if event.json_data is not None:
            members.append(f'"data":  {event.json_data}')
        elif event.data is not None:
            members.append(f'"data_base64": "{base64.b64encode(event.data).decode()}"')
        return {"content-type": "application/cloudevents+json"}, ("{\n" + ",\n".join(members) + "\n}").encode()
    headers = {("content-type" if k == "datacontenttype" else f"ce-{k}"):
               (v if k == "datacontenttype" else quote(v, safe=HEADER_SAFE)) for k, v in event.strings().items()}
    return headers, event.data or b""


def received(headers: Mapping[str, str], body: bytes) -> tuple[dict[str, str], bytes | None, bytes]:
    """(attributes as strings, data bytes, the body) of what a subscriber got, by the HTTP binding."""
    lowered = {k.lower(): v for k, v in headers.items()}
    if lowered.get("content-type") == "application/cloudevents+json":
        doc = json.loads(body)
        attrs = {k: ("true" if v else "false") if isinstance(v, bool) else str(v)
                 for k, v in doc.items() if k not in ("data", "data_base64")}
        if "data_base64" in doc:
            return attrs, base64.b64decode(doc["data_base64"]), body
        if "data" not in doc:
            return attrs, None, body
        if isinstance(doc["data"], str) and attrs.get("datacontenttype") not in (None, *JSONISH):
            return attrs, doc["data"].encode(), body
        return attrs, b"<json>", body
    attrs = {k[3:]: unquote(v) for k, v in lowered.items() if k.startswith("ce-")}
    if "content-type" in lowered:
        attrs["datacontenttype"] = lowered["content-type"]
    return attrs, body or None, body


JSONISH = ("application/json", "application/json; charset=utf-8", "application/vnd.x+json", "text/json")


def assert_arrived_as_sent(event: Event, headers: Mapping[str, str], body: bytes) -> None:
    """What a subscriber got is ``event``: every attribute's string, and the data bytes — JSON data in a document
    as the sender's very text."""
    attrs, got, out = received(headers, body)
    assert attrs == event.strings()
    if got == b"<json>":
        if event.json_data is not None:  # sent structured: the member's text, whatever document it is now in
            assert f'"data":{event.json_data}'.encode() in out or f'"data":  {event.json_data}'.encode() in out
        else:  # sent binary: the body's bytes as the member
            assert event.data is not None and b'"data":' + event.data in out
    else:
        assert got == event.data
