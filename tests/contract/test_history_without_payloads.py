"""A todo's history without its payload (the board shows the payload once, in its own panel)."""

from __future__ import annotations

from .harness import CLI


def test_history_can_leave_the_payload_out_and_says_so(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended, "with a payload", payload={"big": "x" * 1000})["id"]
    whole = sb.app.history(todo_id, caller=CLI)["events"]
    lean = sb.app.history(todo_id, caller=CLI, payloads=False)["events"]

    assert whole[0]["data"]["payload"] == {"big": "x" * 1000} and "omitted" not in whole[0]
    assert "payload" not in lean[0]["data"] and lean[0]["omitted"] == ["payload"]
    assert {k: v for k, v in lean[0]["data"].items()} == {k: v for k, v in whole[0]["data"].items() if k != "payload"}
    assert [e["type"] for e in lean] == [e["type"] for e in whole] and lean[1:] == whole[1:]


def test_a_null_payload_is_not_called_omitted(sb):
    vended = sb.vend("worker")
    todo_id = sb.push(vended, "no payload")["id"]
    lean = sb.app.history(todo_id, caller=CLI, payloads=False)["events"]
    assert lean[0]["data"]["payload"] is None and "omitted" not in lean[0]
