"""The pure parts of lane isolation: the bubblewrap argv, the rlimit mapping, the mode."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from orchestra_sup.errors import ConfigError
from orchestra_sup.shards import isolation
from orchestra_sup.shards.isolation import IsolationSettings, bwrap_argv, rlimits, set_rlimits_fn


def _argv(**kw: object) -> list[str]:
    args: dict[str, object] = {
        "sandbox": Path("/state/sandboxes/L"),
        "hidden": [Path("/root"), Path("/state"), Path("/run/osup")],
        "readable": [Path("/root/.pyenv/versions/3.11"), Path("/usr/lib/python3")],
        "files": [Path("/state/inboxes/L")],
        "tmpfs_bytes": 1024,
    }
    args.update(kw)
    return bwrap_argv("/usr/bin/bwrap", **args)  # type: ignore[arg-type]


def _pairs(argv: list[str], flag: str) -> list[str]:
    """The operand after each occurrence of `flag`."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def test_bwrap_argv_hides_then_binds_back_in_order() -> None:
    """tmpfs over /tmp and each hidden directory first (outermost first), then read-only binds
    only of what a tmpfs covers, then the inbox and the sandbox (the only writable bind), then
    the namespaces."""
    argv = _argv()
    assert argv[:8] == ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    assert _pairs(argv, "--tmpfs") == ["/root", "/state", "/tmp", "/run/osup"]
    assert _pairs(argv, "--size") == ["1024"] * 4
    assert _pairs(argv, "--ro-bind") == ["/", "/root/.pyenv/versions/3.11", "/state/inboxes/L"]
    assert _pairs(argv, "--bind") == ["/state/sandboxes/L"]
    assert _pairs(argv, "--chdir") == ["/state/sandboxes/L"]
    last_mount = max(i for i, a in enumerate(argv) if a in ("--tmpfs", "--ro-bind", "--bind"))
    assert last_mount < argv.index("--unshare-all")
    assert argv.index("--tmpfs") < argv.index("--ro-bind", 2) < argv.index("--bind")
    for flag in ("--unshare-user", "--disable-userns", "--die-with-parent"):
        assert flag in argv
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert "--new-session" not in argv  # the shard kills the command's process group
    assert argv[-1] == "--"


def test_bwrap_argv_drops_nested_paths() -> None:
    """A hidden directory inside another (or inside /tmp) is covered already; a readable one
    inside another is bound with it."""
    argv = _argv(
        hidden=[Path("/root"), Path("/root/.local/state"), Path("/tmp/x/run")],
        readable=[Path("/root/venv"), Path("/root/venv/lib"), Path("/tmp/ws/.git/objects")],
    )
    assert _pairs(argv, "--tmpfs") == ["/root", "/tmp"]
    assert _pairs(argv, "--ro-bind")[1:3] == ["/root/venv", "/tmp/ws/.git/objects"]


def test_rlimits_map_settings_and_the_cpu_grant() -> None:
    """AS, NOFILE and FSIZE from the settings; CPU one second past the grant's seconds left
    (the budget stop comes first), rounded up, at least 1; none without a grant."""
    settings = IsolationSettings(max_memory_bytes=1 << 30, max_open_files=256, max_file_bytes=4096)
    assert rlimits(settings, None) == {
        resource.RLIMIT_AS: 1 << 30,
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_FSIZE: 4096,
    }
    assert rlimits(settings, 2.1)[resource.RLIMIT_CPU] == 4
    assert rlimits(settings, -5.0)[resource.RLIMIT_CPU] == 1


def test_set_rlimits_fn_clamps_to_the_hard_limit_and_gives_cpu_a_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Limits above the current hard limit are clamped to it; RLIMIT_CPU's hard limit is one
    second above its soft one (SIGXCPU, then SIGKILL)."""
    hard = {resource.RLIMIT_NOFILE: 100, resource.RLIMIT_CPU: resource.RLIM_INFINITY}
    monkeypatch.setattr(resource, "getrlimit", lambda which: (0, hard[which]))
    set_calls: list[tuple[int, tuple[int, int]]] = []
    monkeypatch.setattr(resource, "setrlimit", lambda which, pair: set_calls.append((which, pair)))
    set_rlimits_fn({resource.RLIMIT_NOFILE: 4096, resource.RLIMIT_CPU: 7})()
    assert set_calls == [(resource.RLIMIT_NOFILE, (100, 100)), (resource.RLIMIT_CPU, (7, 8))]


def test_resolve_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto picks bwrap where it works, else none; bwrap without it is a ConfigError that says
    why; none is always none."""
    monkeypatch.setattr(isolation, "bwrap_problem", lambda: None)
    assert isolation.resolve("auto") == isolation.resolve("bwrap") == "bwrap"
    monkeypatch.setattr(isolation, "bwrap_problem", lambda: "bwrap not found on PATH")
    assert isolation.resolve("auto") == isolation.resolve("none") == "none"
    with pytest.raises(ConfigError, match='mode = "bwrap": bubblewrap is not usable: bwrap not'):
        isolation.resolve("bwrap")
    with pytest.raises(ConfigError, match="expected one of auto, bwrap, none"):
        isolation.resolve("jail")
