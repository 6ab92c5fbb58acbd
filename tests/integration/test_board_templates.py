"""The board's templates on the fault trace of CONTRACT §15 and on rule numbers, rendered by the board's
own Jinja environment (the pages in a browser are in tests/browser/test_board_details.py)."""

from __future__ import annotations

import html
import re

import pytest

from interfaces.http.board import Board, excerpt, rule_number

TIMEOUT = {"stage": "fault", "rule_index": 2, "rule_id": "slow", "reason": "timeout",
           "detail": "rule slow ran over its 50 ms budget", "action": {"queue": "quarantine"}}


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    from interfaces.bootstrap import build
    from interfaces.settings import Settings

    root = tmp_path_factory.mktemp("templates")
    container = build(Settings(database_url=f"sqlite:///{root}/s.db", data_dir=str(root)))
    yield Board(container)
    container.close()


def text_of(markup: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", markup))).strip()


def trace(board: Board, routing) -> str:
    return board.env.from_string('{% import "macros.html" as m %}{{ m.trace(routing) }}').render(routing=routing)


def test_a_fault_trace_shows_its_reason_detail_and_the_rule_counted_from_1(board):
    shown = trace(board, TIMEOUT)
    assert 'data-fault-reason>timeout</span>' in shown
    assert "Rule #3 slow" in text_of(shown)  # rule_index 2 is the third rule
    assert "rule slow ran over its 50 ms budget" in text_of(shown)


def test_a_fault_without_a_rule_shows_no_rule_number(board):
    shown = text_of(trace(board, {"stage": "fault", "reason": "too_large", "detail": "envelope over 1 MiB",
                                  "action": {"queue": "quarantine"}}))
    assert "Fault too_large envelope over 1 MiB" in shown and "Rule" not in shown


def test_the_first_rule_reads_as_1(board):
    shown = text_of(trace(board, {"stage": "rule", "rule_index": 0, "rule_id": "first", "action": {"queue": "q"}}))
    assert "Rule #1 first" in shown and "#0" not in shown
    assert rule_number({"stage": "default"}) is None and rule_number({"rule_index": True}) is None


def test_the_quarantine_list_says_why_each_todo_is_held(board):
    row = {"id": "td_1", "queue": "quarantine", "source": "generic", "kind": None, "title": "held one",
           "state": "pending", "trust_mode": "token", "owner": None, "attempt": 0, "max_attempts": 5,
           "created_at": None}
    other = dict(row, id="td_2", title="held before reasons were recorded")
    shown = board.env.get_template("_todos_list.html").render(
        rows=[row, other], faults={"td_1": TIMEOUT}, tabs=[], counts={}, current="quarantine", shown=200)
    first, second = shown.split('data-todo-id="td_2"')
    assert "held: timeout rule slow ran over its 50 ms budget (rule #3)" in text_of(first)
    assert "held:" not in second


def test_an_excerpt_stops_at_the_limit_on_a_character_boundary():
    value = {"text": "ü" * 1000, "more": list(range(1000))}
    cut = excerpt(value, 101)
    assert len(cut.encode()) <= 101 and cut.startswith('{\n  "text": "üü')
    assert excerpt("ab" * 10, 5) == "ababa"
    assert excerpt({"a": 1}) == '{\n  "a": 1\n}'


def test_every_template_is_compiled_off_the_request_path_at_start(board):
    import time

    names = board.env.list_templates(extensions=["html"])
    deadline = time.monotonic() + 10
    while len(board.env.cache) < len(names) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(board.env.cache) >= len(names) > 10
