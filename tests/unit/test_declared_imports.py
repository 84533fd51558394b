"""Every third-party module the code imports comes from a distribution pyproject.toml declares (in the
dependencies or an extra), so a fresh install has it."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"sloserve", "tests"}
# Modules that are files beside their importer, on a path it sets itself
LOCAL = {"trace_rates", "batching_factories", "_ort"}
# The peer systems run in virtual environments of their own (sloserve/loadtests/peers/setup.sh installs them)
OWN_ENVS = ("sloserve/loadtests/peers/",)


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    return {_norm(re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0]) for r in reqs}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def imported() -> dict[str, str]:
    """Top-level module -> a file that imports it, over the packages and the tests."""
    out: dict[str, str] = {}
    for d in sorted(FIRST_PARTY):
        for path in sorted((ROOT / d).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel.startswith(OWN_ENVS):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for n in names:
                    out.setdefault(n.split(".")[0], rel)
    return out


def test_every_third_party_import_is_declared():
    dists = importlib.metadata.packages_distributions()
    have = declared()
    missing = []
    for module, where in sorted(imported().items()):
        if module in FIRST_PARTY or module in LOCAL or module in sys.stdlib_module_names:
            continue
        candidates = {_norm(d) for d in dists.get(module, [module])}  # not installed here: its own name
        if not candidates & have:
            missing.append(f"{module} (imported in {where}; from {sorted(candidates)})")
    assert not missing, "declare in pyproject.toml: " + "; ".join(missing)
