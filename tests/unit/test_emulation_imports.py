"""The operator's path never reaches the emulated API or kubelet, nor kmock.

`kneecap run` and the model commands (fit, advise, simulate, plan, memory), and every module of
kneecap.control, kneecap.model and kneecap.observe, are walked statically: every import
statement of every kneecap module they reach, those inside functions included (the commands
import lazily). What `kneecap demo` and `kneecap replay` use (kneecap.emulation, kneecap.demo,
the virtual cluster of kneecap.sim) and kmock must not be reached.
tests/integration/test_plain_install.py checks the same at run time: the modules the commands
load in the install without extras."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "operator" / "kneecap"
COMMANDS = ("run", "fit", "advise", "simulate", "plan", "memory")
OPERATOR_PACKAGES = ("control", "model", "observe")
EMULATIONS = ("kneecap.emulation", "kneecap.demo", "kneecap.sim.engine_node",
              "kneecap.sim.cluster", "kneecap.sim.hpa", "kneecap.sim.replay", "kneecap.sim.demo_virtual", "kmock")


def module_file(name: str) -> Path | None:
    """The source of kneecap module `name` (its __init__.py for a package), None when there is none."""
    base = PACKAGE.parent.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def operator_roots() -> list[str]:
    roots = ["kneecap.cli", *(f"kneecap.commands.{c}" for c in COMMANDS)]
    for package in OPERATOR_PACKAGES:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            roots.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return roots


def imported_names(path: Path, name: str) -> set[str]:
    """Every module an import statement of `path` (module `name`) names, at any depth."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . / from .. : relative to the package
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            out.add(base)
            out |= {f"{base}.{alias.name}" for alias in node.names if module_file(f"{base}.{alias.name}")}
    return out


def reachable(roots: list[str]) -> dict[str, str]:
    """Every module reachable from `roots` by import statements -> the kneecap module that imports it
    (outside kneecap only the names are kept, not followed)."""
    seen: dict[str, str] = {root: "" for root in roots}
    todo = list(roots)
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None:
            continue
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        for imported in imported_names(path, name) | set(parents):
            if imported not in seen:
                seen[imported] = name
                if imported.split(".")[0] == "kneecap":
                    todo.append(imported)
    return seen


def emulated(name: str) -> bool:
    return any(name == e or name.startswith(e + ".") for e in EMULATIONS)


def test_no_import_statement_on_the_operator_path_reaches_an_emulation():
    graph = reachable(operator_roots())
    assert "kneecap.control.loop" in graph and "kneecap.commands.run" in graph  # the walk found the operator
    reached = {name: graph[name] for name in graph if emulated(name)}
    assert reached == {}, f"imported by: {reached}"
