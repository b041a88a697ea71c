"""The layer rule of docs/architecture.md ("What may import what"), read from the imports.

The rule and the reader are `scripts/structure.py` (one source for CI and for a person at a
shell). These tests run it on the real package, and on small packages written here, so the
reader is shown to catch what it must: an import inside a function, a relative import, an
import of a role by another role, a cycle, and to leave `if TYPE_CHECKING:` imports alone.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "structure.py"


def _load():
    spec = importlib.util.spec_from_file_location("structure", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("structure", module)
    spec.loader.exec_module(module)
    return module


structure = _load()
PACKAGE = SCRIPT.parent.parent / "orchestra_sup"
LAYER = structure.LAYERS
HOW = (
    "python3 scripts/structure.py prints all of it; docs/architecture.md says what may import what"
)


def test_the_package_keeps_the_layer_rule():
    edges, _lines = structure.graph(PACKAGE)
    assert structure.broken_rules(edges) == [], HOW


def test_the_package_has_no_import_cycle():
    edges, _lines = structure.graph(PACKAGE)
    assert structure.cycles(edges) == [], HOW


def test_no_module_is_over_the_line_limit():
    _edges, lines = structure.graph(PACKAGE)
    over = {module: n for module, n in lines.items() if n > structure.MAX_LINES}
    assert over == {}


def test_every_part_of_the_package_has_a_layer():
    edges, _lines = structure.graph(PACKAGE)
    parts = {structure.part_of(module) for module in edges}
    assert parts <= set(structure.LAYERS), sorted(parts - set(structure.LAYERS))


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "orchestra_sup"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in [root, *root.rglob("*")]:
        if directory.is_dir() and not (directory / "__init__.py").exists():
            (directory / "__init__.py").write_text("")
    return root


def _broken(tmp_path: Path, files: dict[str, str]) -> list[str]:
    edges, _lines = structure.graph(_package(tmp_path, files))
    return structure.broken_rules(edges)


def test_a_role_importing_another_role_breaks_the_rule(tmp_path):
    broken = _broken(
        tmp_path,
        {
            "shards/program.py": "SHELL = 'shell'\n",
            "coordinator/plan.py": "from orchestra_sup.shards.program import SHELL\n",
        },
    )
    assert broken == [
        "orchestra_sup.coordinator.plan -> orchestra_sup.shards.program: "
        "a role imports another role"
    ]


def test_an_import_inside_a_function_counts(tmp_path):
    broken = _broken(
        tmp_path,
        {
            "shards/cgroup.py": "def kill(): ...\n",
            "config.py": "def load():\n    from orchestra_sup.shards import cgroup\n",
        },
    )
    assert broken == [
        "orchestra_sup.config -> orchestra_sup.shards.cgroup: "
        f"layer {LAYER['config']} (config) imports layer {LAYER['shards']} (shards)"
    ]


def test_a_relative_import_is_resolved(tmp_path):
    broken = _broken(
        tmp_path,
        {"errors.py": "from .protocol import frames\n", "protocol/frames.py": "X = 1\n"},
    )
    assert broken == [
        "orchestra_sup.errors -> orchestra_sup.protocol.frames: layer 0 (errors) imports "
        f"layer {LAYER['protocol']} (protocol)"
    ]


def test_an_import_within_one_layer_but_another_part_breaks_the_rule(tmp_path):
    broken = _broken(
        tmp_path,
        {"config.py": "from orchestra_sup import release\n", "release.py": "V = 1\n"},
    )
    assert broken == [
        "orchestra_sup.config -> orchestra_sup.release: "
        f"layer {LAYER['config']} (config) imports layer {LAYER['release']} (release)"
    ]


def test_type_checking_imports_are_left_out(tmp_path):
    broken = _broken(
        tmp_path,
        {
            "supervisor/root.py": "class RootSupervisor: ...\n",
            "protocol/frames.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from orchestra_sup.supervisor.root import RootSupervisor\n"
                "else:\n"
                "    import json\n"
            ),
        },
    )
    assert broken == []


def test_a_new_part_needs_a_layer(tmp_path):
    broken = _broken(
        tmp_path, {"utils.py": "from orchestra_sup import errors\n", "errors.py": "E = 1\n"}
    )
    assert broken == ["orchestra_sup.utils -> orchestra_sup.errors: part 'utils' has no layer"]


def test_a_cycle_through_a_function_level_import_is_found(tmp_path):
    root = _package(
        tmp_path,
        {
            "supervisor/root.py": "from orchestra_sup.supervisor import reload\n",
            "supervisor/reload.py": "def go():\n    from orchestra_sup.supervisor import root\n",
        },
    )
    edges, _lines = structure.graph(root)
    assert structure.cycles(edges) == [
        ["orchestra_sup.supervisor.reload", "orchestra_sup.supervisor.root"]
    ]


@pytest.mark.parametrize("flag", ["", "--json"])
def test_the_script_exits_1_on_a_broken_rule(flag, tmp_path, capsys, monkeypatch):
    files = {"config.py": "from orchestra_sup.cli import app\n", "cli/app.py": ""}
    root = _package(tmp_path, files)
    monkeypatch.setattr(structure, "PACKAGE_DIR", root)
    assert structure.main([flag] if flag else []) == 1
    assert "orchestra_sup.config -> orchestra_sup.cli.app" in capsys.readouterr().out
