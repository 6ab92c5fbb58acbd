"""The user docs stay true to the tree: every command and flag they show exists in the CLI's parser,
every route in the app, every MCP verb is documented (and no other), every local link resolves, and
nothing points outside the repository (a clone has no ../shared)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from domain.endpoint import ALL_VERBS
from interfaces.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference.md"
USER_DOCS = [ROOT / "README.md", REFERENCE, ROOT / "docs" / "operations.md", ROOT / "deploy" / "README.md",
             ROOT / "docs" / "audit.md"]
# what the CLI and route checks read
CHECKED = [ROOT / "README.md", REFERENCE, ROOT / "docs" / "operations.md", ROOT / "docs" / "audit.md"]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def documented_commands() -> list[tuple[str, list[str]]]:
    """(file, tokens after `switchboard`) of every command line the docs show."""
    found = []
    for path in CHECKED:
        text = path.read_text()
        spans = re.findall(r"`switchboard ([^`]+)`", text)
        spans += re.findall(r"^\s*(?:\.venv/bin/)?switchboard ([^\n#]+)", text, re.M)
        found += [(path.name, span.replace("\\|", "|").split()) for span in spans]
    return found


@pytest.mark.parametrize(("where", "tokens"), documented_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_documented_command_and_flag_exists(where, tokens):
    parser = build_parser()
    globals_ = _flags(parser)
    words = [t.strip("[](){}|…,") for t in tokens]
    path = []
    while words and (sub := _subcommands(parser)) and words[0] in sub:
        parser = sub[words.pop(0)]
        path.append(parser.prog)
    assert path, f"{where}: `switchboard {' '.join(tokens)}` names no command"
    assert not _subcommands(parser), f"{where}: `switchboard {' '.join(tokens)}` stops at a command group"
    for word in words:
        for flag in re.findall(r"^--[a-z][a-z-]*", word):
            assert flag in _flags(parser) | globals_, f"{where}: {parser.prog} has no {flag}"


def test_every_mcp_verb_is_documented_and_only_those():
    section = REFERENCE.read_text().split("### Verbs", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z_]+)` \|", section, re.M)
    assert sorted(rows) == sorted(ALL_VERBS) and len(rows) == len(set(rows))


@pytest.fixture(scope="module")
def app_routes(tmp_path_factory) -> set[tuple[str, str]]:
    from interfaces.bootstrap import build
    from interfaces.http.app import create_app
    from interfaces.settings import Settings

    root = tmp_path_factory.mktemp("routes")
    container = build(Settings(database_url=f"sqlite:///{root}/s.db", data_dir=str(root)))
    try:
        app = create_app(container)
        routes = set()
        for route in app.routes:
            path = re.sub(r"\{([a-z_]+)(:[a-z]+)?\}", "{}", route.path)
            methods = getattr(route, "methods", None) or {"GET", "POST", "DELETE"}  # the MCP mount
            routes |= {(method, path) for method in methods}
        return routes
    finally:
        container.close()


def test_every_documented_route_exists(app_routes):
    text = "\n".join(path.read_text() for path in CHECKED)
    documented = set(re.findall(r"`(GET|POST|PUT|DELETE) (/[^`\s?]*)", text))
    assert len(documented) > 30
    missing = []
    for method, path in sorted(documented):
        shape = re.sub(r"\{[^}]*\}", "{}", path)
        mounted = shape.startswith("/mcp/") and (method, "/mcp") in app_routes
        if (method, shape) not in app_routes and not mounted:
            missing.append(f"{method} {path}")
    assert not missing, f"documented but not routed: {missing}"


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M)}


@pytest.mark.parametrize("doc", USER_DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_local_links_resolve_and_nothing_points_outside_the_repository(doc):
    text = doc.read_text()
    assert "../shared" not in text and "CONTRACT.md" not in text
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        resolved = (doc.parent / file).resolve() if file else doc
        assert resolved.exists(), f"{doc.name} links to {target}, which does not exist"
        assert ROOT in resolved.parents or resolved == ROOT, f"{doc.name} links outside the repository: {target}"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved.read_text()), f"{doc.name} links to a missing anchor: {target}"
