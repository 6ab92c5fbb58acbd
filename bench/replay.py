"""Replay throughput of the jq rules engine against baselines measured in the same run.

Run:  .venv/bin/python bench/replay.py [--deliveries 10000] [--rounds 3] [--workers 2]

Workload (CONTRACT §5 replay): N stored GitHub `issues` envelopes of ~5 KB as JSON text,
a 3-rule candidate set compared with a 3-rule saved set (`evaluate_many(..., compare_with=)`),
on `--workers` worker processes. Not timed: generating the envelopes, starting the workers,
and one warm-up pass (each worker compiles the rule programs once).

Baselines, one process, same envelopes:
- `json.loads` of every envelope (what any Python-side evaluation would pay first);
- jq's trivial program `.` fed the envelope text (`input_text`), i.e. jq's parse cost alone.

Prints deliveries/s for each and the ratios; exits 1 when the engine is under --target.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import jq  # noqa: E402

from domain.routing import Faulted, Matched, NoMatch  # noqa: E402
from domain.rule_set import parse_rule_set  # noqa: E402
from interfaces.rules import JqRuleEngine  # noqa: E402

WORDS = "the server crashes when a webhook arrives with labels and an empty body after deploy".split()
TITLES = ["Crash on start", "URGENT: prod down", "Docs typo", "Add dark mode", "Slow query on /todos"]
LABELS = ["bug", "enhancement", "docs", "urgent", "triage", "p1", "p2"]
REPOS = ["acme/api", "acme/web", "acme/infra", "other/lib"]

CANDIDATE = {
    "rules": [
        {"id": "bugs", "expr": '.kind == "issues" and .payload.action == "opened" '
                               'and (.payload.issue.labels | map(.name) | index("bug"))',
         "action": {"queue": "bugs"}},
        {"id": "urgent", "expr": '.payload.issue.title | test("urgent"; "i")', "action": {"queue": "urgent"}},
        {"id": "ours", "expr": ".payload.repository.full_name | IN($params.repos[])", "action": {"queue": "ours"}},
    ],
    "default_action": {"drop": True},
    "params": {"repos": ["acme/api", "acme/web"]},
}
SAVED = {
    "rules": [
        {"id": "closed", "expr": '.payload.action == "closed"', "action": {"drop": True}},
        {"id": "p1", "expr": 'any(.payload.issue.labels[]; .name == "p1")', "action": {"queue": "urgent"}},
        {"id": "busy", "expr": ".payload.issue.comments > $params.comments", "action": {"queue": "busy"}},
    ],
    "params": {"comments": 10},
}


def _user(rnd: random.Random, login: str) -> dict:
    return {"login": login, "id": rnd.randint(1, 10**7), "node_id": "MDQ6VXNlcjE=",
            "avatar_url": f"https://avatars.githubusercontent.com/u/{rnd.randint(1, 10**7)}?v=4",
            "gravatar_id": "", "url": f"https://api.github.com/users/{login}",
            "html_url": f"https://github.com/{login}", "followers_url": f"https://api.github.com/users/{login}/followers",
            "repos_url": f"https://api.github.com/users/{login}/repos", "type": "User", "site_admin": False}


def github_issue_envelope(i: int, rnd: random.Random) -> dict:
    """An envelope shaped like a GitHub `issues` delivery, about 5 KB as JSON."""
    repo = rnd.choice(REPOS)
    labels = rnd.sample(LABELS, rnd.randint(0, 3))
    issue = {
        "url": f"https://api.github.com/repos/{repo}/issues/{i}", "repository_url": f"https://api.github.com/repos/{repo}",
        "labels_url": f"https://api.github.com/repos/{repo}/issues/{i}/labels{{/name}}",
        "comments_url": f"https://api.github.com/repos/{repo}/issues/{i}/comments",
        "html_url": f"https://github.com/{repo}/issues/{i}", "id": 10**9 + i, "node_id": "I_kwDOAbcdefgh", "number": i,
        "title": f"{rnd.choice(TITLES)} #{i}", "user": _user(rnd, f"user{i % 97}"),
        "labels": [{"id": 600 + j, "node_id": "LA_kwDO", "url": f"https://api.github.com/repos/{repo}/labels/{name}",
                    "name": name, "color": "d73a4a", "default": False, "description": f"{name} label"}
                   for j, name in enumerate(labels)],
        "state": "open", "locked": False, "assignee": None, "assignees": [], "milestone": None,
        "comments": rnd.randint(0, 20), "created_at": "2026-11-01T10:00:00Z", "updated_at": "2026-11-02T10:00:00Z",
        "closed_at": None, "author_association": "MEMBER", "active_lock_reason": None,
        "body": "Steps to reproduce:\n" + " ".join(rnd.choice(WORDS) for _ in range(330)),
        "reactions": {"total_count": 0, "+1": 0, "-1": 0, "laugh": 0, "hooray": 0, "confused": 0, "heart": 0},
    }
    owner, name = repo.split("/")
    repository = {
        "id": 123456, "node_id": "R_kgDOabc", "name": name, "full_name": repo, "private": False,
        "owner": _user(rnd, owner), "html_url": f"https://github.com/{repo}", "description": "A repository",
        "fork": False, "url": f"https://api.github.com/repos/{repo}", "created_at": "2020-01-01T00:00:00Z",
        "updated_at": "2026-11-01T00:00:00Z", "pushed_at": "2026-11-01T00:00:00Z", "default_branch": "main",
        "open_issues_count": 42, "topics": ["webhooks", "agents"], "visibility": "public", "stargazers_count": 7,
    }
    payload = {"action": rnd.choice(["opened", "closed", "labeled", "edited", "reopened"]), "issue": issue,
               "repository": repository, "sender": _user(rnd, f"user{i % 13}")}
    headers = {"x-github-event": "issues", "x-github-delivery": f"72d3162e-cc78-11e3-81ab-{i:012d}",
               "x-hub-signature-256": "«redacted»", "content-type": "application/json",
               "user-agent": "GitHub-Hookshot/044aadd"}
    return {"source": "github", "kind": "issues", "webhook_id": "wh_" + "0" * 32, "trust_mode": "signed",
            "verified": True, "content_type": "application/json", "size": 5000, "headers": headers, "payload": payload}


def rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--target", type=float, default=5_000.0, help="deliveries/s the engine must reach")
    args = parser.parse_args()

    rnd = random.Random(7)
    texts = [json.dumps(github_issue_envelope(i, rnd), separators=(",", ":")) for i in range(args.deliveries)]
    mean_size = sum(len(t) for t in texts) / len(texts)
    ids = iter(range(10**6))
    candidate = parse_rule_set(CANDIDATE, new_rule_id=lambda: f"rule_{next(ids):024x}")
    saved = parse_rule_set(SAVED, new_rule_id=lambda: f"rule_{next(ids):024x}")
    print(f"{len(texts)} envelopes, mean {mean_size:,.0f} bytes; candidate 3 rules vs saved 3 rules; "
          f"{args.workers} workers")

    engine = JqRuleEngine(workers=args.workers)
    engine.start()
    try:
        engine.check_compiles(candidate)
        engine.evaluate_many(candidate, texts[:2000], compare_with=saved)  # warm-up: compile everywhere
        engine_rates, outcomes = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            outcomes = engine.evaluate_many(candidate, texts, compare_with=saved)
            engine_rates.append(rate(len(texts), time.perf_counter() - started))
    finally:
        engine.close()

    loads_rates, jq_rates = [], []
    identity = jq.compile(".")
    for _ in range(args.rounds):
        started = time.perf_counter()
        for text in texts:
            json.loads(text)
        loads_rates.append(rate(len(texts), time.perf_counter() - started))
        started = time.perf_counter()
        for text in texts:
            next(iter(identity.input_text(text)))
        jq_rates.append(rate(len(texts), time.perf_counter() - started))

    tally: dict[str, int] = {}
    for after, before in outcomes:
        for side, outcome in (("after", after), ("before", before)):
            name = ("match" if isinstance(outcome, Matched) else "no match" if isinstance(outcome, NoMatch)
                    else "faulted" if isinstance(outcome, Faulted) else "?")
            tally[f"{side} {name}"] = tally.get(f"{side} {name}", 0) + 1
    best, median = max(engine_rates), statistics.median(engine_rates)
    print(f"outcomes: {dict(sorted(tally.items()))}")
    print(f"engine evaluate_many : best {best:9,.0f} deliveries/s   median {median:9,.0f}   "
          f"rounds {[round(r) for r in engine_rates]}")
    print(f"baseline json.loads  : best {max(loads_rates):9,.0f} deliveries/s   (one process)")
    print(f"baseline jq '.' text : best {max(jq_rates):9,.0f} deliveries/s   (one process, parse only)")
    print(f"ratio engine/json.loads {median / max(loads_rates):.2f}x   "
          f"engine/jq-identity {median / max(jq_rates):.2f}x   (median engine over best baseline)")
    if median < args.target:
        print(f"BELOW TARGET: median {median:,.0f} < {args.target:,.0f} deliveries/s")
        return 1
    print(f"target {args.target:,.0f} deliveries/s: met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
