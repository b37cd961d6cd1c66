"""The layout's rules (docs/architecture.md), read from the source: which room may import which, and no module
imports one that imports it back (at any depth, function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("a2po", "storage", "app", "benchmarks")
# What each room may import of the project's other rooms (its own room always).
ALLOWED = {
    "a2po": set(),
    "storage": {"a2po.answers", "a2po.names"},
    "app.runtime": {"a2po", "storage", "app.access.policy"},
    "app.studies": {"a2po", "storage"},
    "app.access": {"a2po", "storage", "app.studies"},
    "app.web": {"a2po", "storage", "app.access", "app.runtime", "app.studies"},
    "app": {"a2po", "storage", "app.access", "app.runtime", "app.web", "app.studies"},
    "benchmarks": {"a2po", "storage", "app"},
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> project modules it imports anywhere in its source (`from pkg import sub` counts as `pkg.sub`)."""
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(mods)
                targets.update(subs if len(subs) == len(node.names) else {node.module, *subs})
        edges[name] = {t for t in targets if t in mods and t != name}
    return edges


def room(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "app" and len(parts) > 1 and parts[1] in ("runtime", "access", "web", "studies"):
        return f"app.{parts[1]}"
    return parts[0]


def allowed(source: str, target: str) -> bool:
    if room(source) == room(target) or (room(source) == "app" and target == "app"):
        return True
    return any(target == a or target.startswith(a + ".") for a in ALLOWED[room(source)])


def test_rooms_import_only_downwards():
    edges = imports(modules())
    wrong = sorted(f"{a} imports {b}" for a, targets in edges.items() for b in targets if not allowed(a, b))
    assert not wrong, "\n".join(wrong)


def test_no_import_circles():
    edges = imports(modules())
    circles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for target in sorted(edges.get(module, ())):
            if target in path:
                circles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(module)

    for module in sorted(edges):
        if module not in done:
            visit(module, [module])
    assert not circles, "\n".join(circles)


@pytest.mark.slow
def test_the_studio_web_process_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, app.web, app.access.allowlist, app.runtime.scheduler; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
