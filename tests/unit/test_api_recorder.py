"""The chaos test's relay reads the `lastseen` kopf stamped in a peering keep-alive (the peers' deadlines come
from it, not from when the request reached the relay)."""

import json
from datetime import UTC, datetime

from vlm_testing.api_recorder import _peering_stamp

PATH = "/apis/kopf.dev/v1/namespaces/ns/kopfpeerings/vlm-operator"


def test_the_stamp_kopf_wrote_is_read_as_unix_seconds():
    t = datetime(2026, 12, 2, 16, 30, 5, 250000, tzinfo=UTC)
    body = {"status": {"replica-a": {"priority": 7, "lifetime": 20, "lastseen": t.isoformat()}}}
    assert _peering_stamp(PATH, json.dumps(body).encode()) == t.timestamp()


def test_a_clean_up_a_farewell_and_other_requests_have_no_stamp():
    assert _peering_stamp(PATH, json.dumps({"status": {"replica-a": None}}).encode()) is None
    assert _peering_stamp(PATH, b"not json") is None
    assert _peering_stamp(PATH, None) is None
    body = {"status": {"replica-a": {"lastseen": "2026-12-02T16:30:05+00:00"}}}
    assert _peering_stamp("/apis/apps/v1/namespaces/ns/deployments/x", json.dumps(body).encode()) is None
