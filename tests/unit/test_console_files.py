"""The console's files (`web/console/`, `web.static`): each one served ships in a wheel, the
page names only files that are served, and nothing in them needs what the CSP
(`default-src 'self'`) forbids or writes markup from the tree's data."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from pathlib import Path

from orchestra_sup.web import static

ROOT = Path(__file__).resolve().parents[2]
CONSOLE = ROOT / "orchestra_sup" / "web" / "console"


def test_the_served_files_are_the_directory_and_ship_in_a_wheel() -> None:
    assert {p.name for p in CONSOLE.iterdir()} == set(static.FILES)
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setuptools["package-data"]["orchestra_sup.web"]
    for name in static.FILES:
        assert any(fnmatch.fnmatch(f"console/{name}", g) for g in globs), (name, globs)


def test_the_page_loads_only_served_files_and_nothing_inline() -> None:
    page = (CONSOLE / "index.html").read_text()
    named = set(re.findall(r'(?:src|href)="([^"]+)"', page))
    assert named == {f"/console/{name}" for name in static.FILES if name != "index.html"}
    assert re.findall(r"<script\b[^>]*>", page) == [
        '<script type="module" src="/console/console.js">'
    ]
    assert not re.search(r"<style\b|\sstyle=|\son[a-z]+=|javascript:", page, re.IGNORECASE)


def test_the_script_puts_text_in_the_page_never_markup() -> None:
    script = (CONSOLE / "console.js").read_text()
    found = re.findall(
        r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\(|new Function", script
    )
    assert found == []
    assert not re.search(r"\.style\b|setAttribute\(\s*[\"']style", script)
