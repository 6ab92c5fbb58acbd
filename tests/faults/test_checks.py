"""The fault suite's checks themselves, on made-up answers and logs: each finds the problem it
names (so a scenario passing means the product behaved, not that the check cannot fail).

No cluster needed: these run in `make test-quick` too.
"""

from __future__ import annotations

from collections import Counter

from tests.e2e._support import Result
from tests.faults import _scenario as s
from tests.faults._load import Answer

T1, T2 = "td_" + "1" * 32, "td_" + "2" * 32
H1, H2 = "1" * 32, "2" * 32


def outcome(answers: list[Answer], *, deliveries=None, opened=(), claims=None, completes=None,
            stderr: str = "") -> s.Outcome:
    ledger = s.Ledger(deliveries or {}, set(opened), Counter(claims or {}), Counter(completes or {}))
    return s.Outcome("made-up", s.SCENARIOS["pg_restart"], answers, began=10.0, ended=12.0, load_ended=20.0,
                     ledger=ledger, verify=Result((), 0, "", "", 0.0), fault_stderr={"a": stderr},
                     exit_codes={"a": 0}, notes={})


def ingest(outcome_: str, delivery: str, todos=(), started: float = 11.0, seconds: float = 0.1) -> Answer:
    return Answer("ingest", "http://x", started, seconds, outcome_, delivery=delivery, todos=list(todos),
                  status={"ok": 202, "unavailable": 503}.get(outcome_))


def tool(kind: str, outcome_: str, todo: str | None = None, started: float = 11.0, seconds: float = 0.1,
         detail: str = "") -> Answer:
    return Answer(kind, "http://x", started, seconds, outcome_, detail=detail, todos=[todo] if todo else [])


def test_a_202_missing_from_the_log_is_found():
    o = outcome([ingest("ok", "d1", [T1]), ingest("ok", "d2", [T2])], deliveries={"d1": [H1]}, opened={H1})
    problems = s.unstored_202s(o)
    assert len(problems) == 1 and "d2" in problems[0]


def test_a_202_whose_todo_was_not_opened_is_found():
    o = outcome([ingest("ok", "d1", [T1])], deliveries={"d1": [H1]}, opened=set())
    assert len(s.unstored_202s(o)) == 1


def test_a_stored_503_is_found():
    o = outcome([ingest("unavailable", "d1"), ingest("unavailable", "d2")], deliveries={"d1": [H1]}, opened={H1})
    problems = s.stored_503s(o)
    assert len(problems) == 1 and "d1" in problems[0]


def test_doubles_are_found_in_the_log_and_in_the_answers():
    o = outcome([tool("claim_next", "ok", T1), tool("claim_next", "ok", T1)], claims={H1: 2}, completes={H2: 2})
    assert len(s.claimed_or_completed_twice(o)) == 3


def test_a_complete_answered_unavailable_that_was_done_is_found():
    o = outcome([tool("complete", "unavailable", T1), tool("complete", "conflict", T1)], completes={H1: 1})
    assert len(s.completes_untrue(o)) == 1
    ambiguous = outcome([tool("complete", "lost", T1), tool("complete", "conflict", T1)], completes={H1: 1})
    assert s.completes_untrue(ambiguous) == []
    acked_not_done = outcome([tool("complete", "ok", T1)])
    assert len(s.completes_untrue(acked_not_done)) == 1


def test_a_claim_committed_behind_an_error_is_found_unless_an_answer_was_lost():
    o = outcome([tool("claim_next", "ok", T1), tool("claim_next", "unavailable")], claims={H1: 1, H2: 1})
    assert len(s.orphan_claims(o)) == 1
    lost = outcome([tool("claim_next", "ok", T1), tool("claim_next", "lost")], claims={H1: 1, H2: 1})
    assert s.orphan_claims(lost) == []


def test_internal_and_error_answers_are_unexpected():
    o = outcome([tool("complete", "error", T1, detail="internal: store down"),
                 tool("claim_next", "unavailable", detail="unavailable: store down"),
                 tool("claim_next", "unavailable", detail="unavailable: something else"),
                 ingest("error", "d9")])
    assert len(s.unexpected_answers(o)) == 3


def test_slow_answers_during_the_fault_are_found():
    o = outcome([ingest("ok", "d1", started=11.0, seconds=s.ANSWER_BUDGET + 0.5),
                 ingest("ok", "d2", started=5.0, seconds=9.0)])  # asked before the fault: not judged
    assert len(s.slow_answers(o)) == 1


def test_a_commit_in_flight_when_the_store_went_may_be_answered_once_it_is_back():
    o = outcome([ingest("unavailable", "d1", started=10.1, seconds=3.0),  # resolved 1.1 s after the return
                 ingest("unavailable", "d2", started=10.1, seconds=5.0),  # 3.1 s after: too late
                 ingest("unavailable", "d3", started=10.6, seconds=2.5)])  # asked once the store was gone
    o.notes["stopped_after"] = 0.3
    assert [p.split()[0:4] for p in s.slow_answers(o)] == [["ingest", "asked", "at", "+0.10s"],
                                                           ["ingest", "asked", "at", "+0.60s"]]


def test_no_success_after_the_fault_is_found():
    o = outcome([ingest("ok", "d1", started=13.0), tool("claim_next", "ok", T1, started=13.0),
                 tool("complete", "unavailable", T1, started=19.0)])
    problems = s.not_back(o)
    assert any(p.startswith("complete: first success None") for p in problems)
    assert any("failed at the load's end" in p for p in problems)


def test_tracebacks_and_lines_per_retry_on_stderr_are_found():
    per_retry = [f"2026-12-01 07:46:3{i},104 WARNING switchboard.background: scheduler: store unavailable (x)"
                 for i in range(3)]
    per_request = [f"WARNING - 2026-12-01 07:46:3{i},519 - switchboard.mcp - errors - mcp claim_next failed"
                   for i in range(3)]
    o = outcome([], stderr="\n".join(per_retry + per_request + ["Traceback (most recent call last):", '  File "x"']))
    problems = s.noisy_stderr(o)
    assert any("tracebacks" in p for p in problems)
    assert "switchboard.background scheduler (3)" in problems[-1] and "mcp claim_next failed (3)" in problems[-1]
    quiet = outcome([], stderr=(
        "2026-12-01 07:46:38,104 WARNING switchboard.background: scheduler: store unavailable (gone)\n"
        "WARNING - 2026-12-01 07:46:38,104 - switchboard.doorbell - doorbell - doorbell listener: store unavailable (x)\n"
        "2026-12-01 07:46:40,104 WARNING switchboard.background: scheduler: store is back\n"
        "WARNING - 2026-12-01 07:46:40,104 - switchboard.doorbell - doorbell - doorbell listener: store is back\n"))
    assert s.noisy_stderr(quiet) == []
