"""The hash chain's pure rules (domain/audit.py): references, the canonical line, the checker."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from domain.audit import (
    PAYLOADS, REDACTED, ZERO_HASH, Break, Chain, canonical_json, canonical_line, chain_hash, check_order, entry_bytes,
    export_parts, payload_entry, ref_of,
)


def test_a_reference_is_the_sha256_and_size_of_the_exact_bytes():
    assert ref_of(b"abc") == {"sha256": hashlib.sha256(b"abc").hexdigest(), "size": 3}


def test_canonical_json_sorts_keys_by_code_point_at_every_level_and_keeps_utf8():
    value = {"b": [{"z": 1, "a": 2}], "a": "é\n\x01", "Z": 1.5e16, "\U0001f600": None}
    assert canonical_json(value) == '{"Z":1e+16,"a":"é\\n\\u0001","b":[{"a":2,"z":1}],"😀":null}'.replace(
        "1e+16", "1.5e+16").encode()


def test_a_body_is_digested_over_the_raw_bytes_whatever_its_encoding():
    raw = b"\xff\xfe not utf-8"
    data, digests = export_parts("DeliveryAccepted", {"body": base64.b64encode(raw).decode(), "body_encoding": "base64"})
    assert digests == {"body": ref_of(raw)}
    data, digests = export_parts("DeliveryAccepted", {"body": "héllo", "body_encoding": "utf-8"})
    assert digests == {"body": ref_of("héllo".encode())} and data["body"] == "héllo"


def test_a_secret_is_withheld_from_the_export_but_its_reference_is_sealed():
    data, digests = export_parts("OperatorCreated", {"name": "alice", "password_hash": "$argon2id$x"})
    assert data["password_hash"] == REDACTED
    assert digests["password_hash"] == ref_of(b'"$argon2id$x"')


def _record(data: dict, event_type: str = "TodoOpened", position: int = 1, version: int = 1) -> dict:
    data, digests = export_parts(event_type, data)
    record = {"position": position, "time": "2026-01-01T00:00:00Z", "aggregate": "td_1", "aggregate_type": "todo",
              "version": version, "type": event_type, "actor": "a", "cause": "c", "data": data}
    if digests:
        record["digests"] = digests
    return record


def test_an_inline_event_and_its_by_reference_twin_have_the_same_line():
    payload = {"issue": {"number": 7, "title": "ünïcode"}, "n": 1.25}
    inline = _record({"title": "t", "payload": payload, "payload_size": 40})
    by_ref = _record({"title": "t", "payload": None, "payload_ref": ref_of(canonical_json(payload)), "payload_size": 40})
    assert "payload" not in by_ref["data"] and "payload_ref" not in by_ref["data"]
    assert canonical_line(inline) == canonical_line(by_ref)
    pruned = {**inline, "data": {k: v for k, v in inline["data"].items() if k != "payload"}}
    assert canonical_line(pruned) == canonical_line(inline)


def _chain(records: list[dict]) -> list[dict]:
    head = ZERO_HASH
    for record in records:
        record["prev_hash"] = head
        head = record["hash"] = chain_hash(head, canonical_line(record))
    return records


def test_the_chain_is_sha256_of_the_previous_hash_a_newline_and_the_line():
    record = _chain([_record({"title": "t", "payload": 1, "payload_size": 1})])[0]
    assert record["hash"] == hashlib.sha256(ZERO_HASH.encode() + b"\n" + canonical_line(record)).hexdigest()
    assert b"prev_hash" not in canonical_line(record) and b'"payload":{"sha256"' in canonical_line(record)


def _three() -> list[dict]:
    return _chain([_record({"title": f"t{n}", "payload": {"n": n}, "payload_size": 7}, position=n, version=n)
                   for n in (1, 2, 3)])


def _verify(records: list[dict]) -> Chain:
    check_order([r["position"] for r in records])
    chain = Chain()
    for record in records:
        chain.add(record)
    return chain


def test_an_intact_chain_verifies_to_its_head():
    records = _three()
    assert _verify(records).head == records[-1]["hash"]


@pytest.mark.parametrize("edit, position, kind", [
    (lambda rs: rs[1]["data"].update(title="T2"), 2, "altered"),
    (lambda rs: rs[1]["data"].update(payload={"n": 9}), 2, "altered"),
    (lambda rs: rs.pop(1), 2, "missing"),
    (lambda rs: rs.insert(2, json.loads(json.dumps(rs[1]))), 2, "duplicated"),
    (lambda rs: rs.insert(1, rs.pop(2)), 2, "out of order"),
])
def test_each_edit_names_the_first_bad_position(edit, position, kind):
    records = _three()
    edit(records)
    with pytest.raises(Break) as broken:
        _verify(records)
    assert (broken.value.position, broken.value.kind) == (position, kind)
    assert str(broken.value).startswith(f"chain broken at position {position}: {kind} (")


def test_a_version_sealed_twice_is_a_duplicate_even_when_the_links_hold():
    records = _three()
    copy = {**json.loads(json.dumps(records[0])), "position": 4}
    records.append(copy)
    _chain(records)
    with pytest.raises(Break) as broken:
        _verify(records)
    assert (broken.value.position, broken.value.kind) == (4, "duplicated")


@pytest.mark.parametrize("field, value", [("digests", "x"), ("data", [1]), ("digests", {"payload": "x"})])
def test_a_line_whose_parts_are_not_objects_is_altered_not_a_crash(field, value):
    records = _three()
    records[1][field] = value
    with pytest.raises(Break) as broken:
        _verify(records)
    assert (broken.value.position, broken.value.kind) == (2, "altered")


# -- payloads carried by an export (`audit export --payloads`) --------------------------------


def test_a_payload_entry_gives_a_json_value_as_itself_and_a_body_as_its_exact_bytes():
    value = {"b": 1, "a": [1.5, "ü"]}  # stored with its keys as given, digested over its canonical JSON
    stored = json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    assert payload_entry(ref_of(canonical_json(value))["sha256"], stored) == {"encoding": "json", "content": value}
    body = b'{"hello":  "world"}'  # a body: digested over the bytes received, spaces and all
    assert payload_entry(ref_of(body)["sha256"], body) == {"encoding": "utf-8", "content": body.decode()}
    raw = b"\xff\xfe not utf-8"
    assert payload_entry(ref_of(raw)["sha256"], raw) == {"encoding": "base64", "content": base64.b64encode(raw).decode()}
    for entry, content in ((payload_entry(ref_of(canonical_json(value))["sha256"], stored), canonical_json(value)),
                           (payload_entry(ref_of(body)["sha256"], body), body),
                           (payload_entry(ref_of(raw)["sha256"], raw), raw)):
        assert entry_bytes(entry) == content


def _carrying(payload) -> dict:
    record = _chain([_record({"title": "t", "payload": None, "payload_ref": ref_of(canonical_json(payload)),
                              "payload_size": 9})])[0]
    sha = record["digests"]["payload"]["sha256"]
    return {**record, PAYLOADS: {sha: payload_entry(sha, json.dumps(payload).encode())}}


def test_payloads_are_outside_the_chain_and_checked_against_their_digests():
    record = _carrying({"n": 1})
    assert canonical_line(record) == canonical_line({k: v for k, v in record.items() if k != PAYLOADS})
    assert Chain().add(record) == record["hash"]
    sha = record["digests"]["payload"]["sha256"]
    for bad, why in (({sha: {"encoding": "json", "content": {"n": 2}}}, "does not match its digest"),
                     ({sha: {"encoding": "utf-8", "content": '{"n":1}'}}, None),  # the same bytes, as text: fine
                     ({"f" * 64: {"encoding": "json", "content": {"n": 1}}}, "is named by none of its digests"),
                     ({sha: {"encoding": "rot13", "content": "x"}}, "cannot be read"),
                     ({sha: {"encoding": "base64", "content": "!!"}}, "cannot be read")):
        edited = {**record, PAYLOADS: bad}
        if why is None:
            assert Chain().add(edited) == record["hash"]
            continue
        with pytest.raises(Break) as broken:
            Chain().add(edited)
        assert (broken.value.position, broken.value.kind) == (1, "altered") and why in broken.value.detail
