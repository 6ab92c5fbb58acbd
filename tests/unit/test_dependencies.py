"""Packaging: every package the code imports is declared, and `make run` installs no test tools.

The import walk reads every module of domain/, application/, projections/ and interfaces/ (imports
inside functions too), keeps the top-level names that are neither the standard library nor our
own packages, maps each to the distribution installed under that name, and requires that
distribution in `[project].dependencies` — a transitive dependency can disappear from under us
whenever the package that pulled it in changes its own requirements.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
OURS = ("domain", "application", "projections", "interfaces")
DEV = ("tests", "bench")  # their imports may also come from the dev extra
TEST_TOOLS = ("pytest", "hypothesis", "playwright", "schemathesis", "py-spy", "httpx")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _declared(requirements: list[str]) -> set[str]:
    return {_normal(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in requirements}


def imported_top_levels(packages: tuple[str, ...] = OURS) -> dict[str, set[str]]:
    """Top-level module name -> the files importing it (absolute imports only)."""
    found: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("packages", [OURS, DEV], ids=["runtime", "tests-and-bench"])
def test_every_imported_package_is_declared_in_pyproject(packages):
    project = _project()
    declared = _declared(project["dependencies"] + (project["optional-dependencies"]["dev"] if packages == DEV else []))
    distributions = packages_distributions()
    undeclared = []
    for name, files in sorted(imported_top_levels(packages).items()):
        if name in sys.stdlib_module_names or name in OURS + DEV or name == "__future__":
            continue
        owners = {_normal(d) for d in distributions.get(name, [])}
        assert owners, f"{name} (imported by {sorted(files)[0]}) is not installed at all"
        if not owners & declared:
            undeclared.append(f"{name} (distribution {', '.join(sorted(owners))}; imported by {', '.join(sorted(files))})")
    assert not undeclared, "imported but not declared in pyproject.toml:\n" + "\n".join(undeclared)


def test_the_runtime_dependencies_carry_no_test_tool():
    runtime = _declared(_project()["dependencies"])
    assert not runtime & {_normal(t) for t in TEST_TOOLS}


def _dry_run(target: str, tmp_path: Path) -> str:
    """What `make TARGET` would run from a fresh clone (no venv yet), without running it."""
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_run_installs_the_runtime_dependencies_only(tmp_path):
    commands = _dry_run("run", tmp_path)
    installs = [line for line in commands.splitlines() if "pip install" in line and "--upgrade pip" not in line]
    assert installs and all("[dev]" not in line for line in installs), commands
    assert any(re.search(r"pip install (-q )?-e \.(\s|$)", line) for line in installs), commands
    assert "switchboard serve" in commands


def test_make_test_still_installs_the_dev_extras(tmp_path):
    commands = _dry_run("test", tmp_path)
    assert '-e ".[dev]"' in commands and "pytest" in commands, commands
