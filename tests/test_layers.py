"""strata_core's packages import downwards only (docs/architecture.md, "The tree")."""

from __future__ import annotations

import ast
from pathlib import Path

import strata_core

#: Lowest first: a package imports only itself and the packages before it.
ORDER = ("contract", "schema", "ops", "backends", "text", "engine", "client", "api", "scale", "testing")
#: Where the order allows an import upwards: the loader of the built-in backend, and the
#: command, which stands on everything.
ALLOWED = {("ops.plugins", "backends"), *(("ops.cli", p) for p in ORDER)}


def _imported(node: ast.ImportFrom | ast.Import, package: list[str]) -> list[str]:
    """The fully qualified names an import statement in ``package`` names (for ``from m
    import n``: ``m.n``, which is a module or an attribute of ``m``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [node.module])])
    return [f"{base}.{a.name}" for a in node.names]


def imports(root: Path) -> list[tuple[str, str]]:
    """(importer, imported) of every import of the package at ``root`` by itself, as names
    inside it (``text.choice``, ``ops.cli.main``); imports inside functions count too,
    attributes of the package itself (``__version__``) do not."""
    pairs = []
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        package = parts[:-1]
        mod = ".".join(package if parts[-1] == "__init__" else parts).removeprefix(root.name + ".")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for name in _imported(node, package):
                    inside = name.removeprefix(root.name + ".")
                    head = inside.split(".")[0]
                    if inside != name and ((root / head).is_dir() or (root / f"{head}.py").is_file()):
                        pairs.append((mod, inside))
    return pairs


def _layer(name: str) -> str:
    """A name's package; ``ops.cli`` and ``ops.plugins`` stand apart from the rest of ``ops``."""
    head, _, rest = name.partition(".")
    sub = rest.split(".")[0]
    return f"ops.{sub}" if head == "ops" and sub in ("cli", "plugins") else head


def upward(pairs: list[tuple[str, str]]) -> list[str]:
    """The imports that go against ORDER, and modules in no package of it."""
    bad = []
    for importer, imported in pairs:
        a, b = _layer(importer), _layer(imported)
        outside = [x for x in (a, b) if x.split(".")[0] not in ORDER]
        if outside:
            bad += [f"{x} is in no package of ORDER" for x in outside]
        elif ORDER.index(b.split(".")[0]) > ORDER.index(a.split(".")[0]) and (a, b.split(".")[0]) not in ALLOWED:
            bad.append(f"{importer} imports {imported}")
        elif b == "ops.cli" and a != "ops.cli":
            bad.append(f"{importer} imports the command ({imported})")
    return sorted(set(bad))


def test_every_package_imports_downwards() -> None:
    pairs = imports(Path(strata_core.__file__).parent)
    assert len(pairs) > 300  # the walk found the package's imports
    assert upward(pairs) == []


def test_the_contract_imports_nothing_else() -> None:
    pairs = imports(Path(strata_core.__file__).parent)
    assert [p for p in pairs if p[0].startswith("contract") and not p[1].startswith("contract")] == []


def test_an_upward_import_is_seen(tmp_path: Path) -> None:
    """The check sees each form of import (absolute, relative, ``from strata_core import``,
    inside a function) and a module outside every layer, and lets a downward one pass."""
    root = tmp_path / "strata_core"
    for pkg in ("text", "api", "ops", "scale"):
        (root / pkg).mkdir(parents=True)
        (root / pkg / "__init__.py").write_text("")
    (root / "__init__.py").write_text("__version__ = '0'\n")
    (root / "reader.py").write_text("")
    (root / "text" / "a.py").write_text("from strata_core.api.bodies import x\n")
    (root / "text" / "b.py").write_text("from ..api import bodies\n")
    (root / "text" / "c.py").write_text("def f():\n    import strata_core.scale.serve\n")
    (root / "scale" / "d.py").write_text("from strata_core.ops import cli\n")
    (root / "api" / "e.py").write_text("from strata_core import __version__\nfrom strata_core.text import a\nfrom . import f\n")
    (root / "api" / "f.py").write_text("from strata_core import reader\n")
    assert upward(imports(root)) == [
        "reader is in no package of ORDER",
        "scale.d imports the command (ops.cli)",
        "text.a imports api.bodies.x",
        "text.b imports api.bodies",
        "text.c imports scale.serve",
    ]
