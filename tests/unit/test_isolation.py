"""The pure parts of lane isolation: the bubblewrap argv, the rlimit mapping, the mode."""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

import pytest

import orchestra_sup
from orchestra_sup.errors import ConfigError
from orchestra_sup.system import isolation, laneuser
from orchestra_sup.system.isolation import (
    IsolationSettings,
    Mounts,
    bwrap_argv,
    rlimits,
    set_rlimits_fn,
)


def _argv(lane_uid: int | None = None, **kw: object) -> list[str]:
    args: dict[str, object] = {
        "sandbox": Path("/state/sandboxes/L"),
        "scratch": (Path("/root"),),
        "readable": (Path("/root/.pyenv/versions/3.11"), Path("/usr/lib/python3")),
        "secret": (Path("/state"), Path("/run/osup")),
        "stores": (Path("/state/workspace/.git/objects"),),
        "files": (Path("/state/inboxes/L"),),
    }
    args.update(kw)
    mounts = Mounts(**args)  # type: ignore[arg-type]
    return bwrap_argv("/usr/bin/bwrap", mounts, tmpfs_bytes=1024, lane_uid=lane_uid)


def _pairs(argv: list[str], flag: str) -> list[str]:
    """The operand after each occurrence of `flag`."""
    return [argv[i + 1] for i, arg in enumerate(argv) if arg == flag]


def _mounts(argv: list[str]) -> list[tuple[str, str]]:
    """(flag, mount point) of each mount, in order, up to the end of the first bubblewrap."""
    end = argv.index("--")
    flags = ("--tmpfs", "--ro-bind", "--bind", "--dir")
    return [(a, argv[i + 1]) for i, a in enumerate(argv[:end]) if a in flags]


def test_bwrap_argv_hides_then_binds_back_in_order() -> None:
    """Scratch tmpfs first (/tmp and the home, outermost first), then read-only binds of only
    what a tmpfs covers, then the secret tmpfs, then the object store, the inbox and the sandbox
    (the only writable bind), every directory on the way to a mount point inside a tmpfs made
    0711 first; then the namespaces."""
    argv = _argv()
    assert argv[:8] == ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    assert _mounts(argv) == [
        ("--ro-bind", "/"),
        ("--tmpfs", "/root"),
        ("--tmpfs", "/tmp"),
        ("--dir", "/root/.pyenv"),
        ("--dir", "/root/.pyenv/versions"),
        ("--ro-bind", "/root/.pyenv/versions/3.11"),
        ("--tmpfs", "/state"),
        ("--tmpfs", "/run/osup"),
        ("--dir", "/state/workspace"),
        ("--dir", "/state/workspace/.git"),
        ("--ro-bind", "/state/workspace/.git/objects"),
        ("--dir", "/state/inboxes"),
        ("--ro-bind", "/state/inboxes/L"),
        ("--dir", "/state/sandboxes"),
        ("--bind", "/state/sandboxes/L"),
    ]
    assert _pairs(argv, "--size") == ["1024"] * 4
    assert (
        _pairs(argv, "--perms") == ["1777", "1777", "0711", "0711", "0711", "0711"] + ["0711"] * 4
    )
    assert _pairs(argv, "--chdir") == ["/state/sandboxes/L"]
    assert argv.index("--chdir") < argv.index("--unshare-all")
    for flag in ("--unshare-user", "--disable-userns", "--die-with-parent"):
        assert flag in argv
    assert _pairs(argv, "--cap-drop") == ["ALL"]
    assert "--new-session" not in argv  # the shard kills the command's process group
    assert argv[-1] == "--"


def test_a_readable_directory_holding_a_secret_one_does_not_bring_it_back() -> None:
    """A tree started from /tmp/probe with its state in /tmp/probe/state: the interpreter's
    import path held /tmp/probe, bound back read-only, and with it the state (issue 17). The
    secret tmpfs comes after every readable bind, so it covers what such a bind brought back;
    the object store inside it is bound after that."""
    argv = _argv(
        sandbox=Path("/tmp/probe/state/sandboxes/L"),
        readable=(Path("/tmp/probe"),),
        secret=(Path("/tmp/probe/state"),),
        stores=(Path("/tmp/probe/state/ws/.git/objects"),),
        files=(),
    )
    order = _mounts(argv)
    assert order.index(("--ro-bind", "/tmp/probe")) < order.index(("--tmpfs", "/tmp/probe/state"))
    assert order.index(("--tmpfs", "/tmp/probe/state")) < order.index(
        ("--ro-bind", "/tmp/probe/state/ws/.git/objects")
    )
    assert order[-1] == ("--bind", "/tmp/probe/state/sandboxes/L")


def test_a_readable_directory_that_holds_a_hidden_one_is_not_bound() -> None:
    """An import path entry that is the home (or holds it, or /tmp) would undo the hiding: it is
    never bound. One outside every tmpfs is in view already: not bound either."""
    argv = _argv(readable=(Path("/root"), Path("/"), Path("/usr/lib/python3")))
    binds = _pairs(argv, "--ro-bind")
    assert binds == ["/", "/state/workspace/.git/objects", "/state/inboxes/L"]


def test_bwrap_argv_drops_nested_paths() -> None:
    """A scratch or secret directory inside another (or inside /tmp) is covered already; a
    readable one inside another is bound with it."""
    argv = _argv(
        scratch=(Path("/root"), Path("/root/.local")),
        secret=(Path("/tmp/x/run"), Path("/state"), Path("/state/keys")),
        readable=(Path("/root/venv"), Path("/root/venv/lib"), Path("/tmp/ws/.git/objects")),
    )
    assert _pairs(argv, "--tmpfs") == ["/root", "/tmp", "/state", "/tmp/x/run"]
    assert _pairs(argv, "--ro-bind")[1:3] == ["/root/venv", "/tmp/ws/.git/objects"]


def test_bwrap_argv_as_a_lane_uid() -> None:
    """As root for a lane's uid: the same mounts, made by a root bubblewrap (a fresh /dev, the
    host's /proc writable for the inner one's maps), which keeps only CAP_SETUID and CAP_SETGID
    for setpriv to become the uid for good; the namespaced bubblewrap then runs as that uid."""
    argv = _argv(lane_uid=1879048200, veiled=(Path("/opt/private"),))
    assert argv[:9] == [
        "/usr/bin/bwrap",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--bind",
        "/proc",
        "/proc",
    ]
    assert ("--tmpfs", "/opt/private") in _mounts(argv)
    outer_end = argv.index("--")
    assert argv[outer_end - 7 : outer_end] == [
        "--cap-drop",
        "ALL",
        "--cap-add",
        "CAP_SETUID",
        "--cap-add",
        "CAP_SETGID",
        "--die-with-parent",
    ]
    setpriv = argv[outer_end + 1 : argv.index("--", outer_end + 1) + 1]
    assert setpriv == [
        "setpriv",
        "--reuid=1879048200",
        "--regid=1879048200",
        "--clear-groups",
        "--inh-caps=-all",
        "--no-new-privs",
        "--",
    ]
    inner = argv[argv.index("--", outer_end + 1) + 1 :]
    assert inner[:10] == [
        "/usr/bin/bwrap",
        "--bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--chdir",
        "/state/sandboxes/L",
    ]
    assert "--unshare-all" in inner and "--disable-userns" in inner and inner[-1] == "--"
    assert "--unshare-all" not in argv[:outer_end]


def test_python_paths_leave_out_the_directory_the_tree_was_started_from(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`python -m` puts its working directory first on the import path; it is not what the
    interpreter needs, and a lane given it saw whatever the tree kept there."""
    started_in, site = tmp_path / "started-in", tmp_path / "site"
    started_in.mkdir()
    site.mkdir()
    monkeypatch.setattr(sys, "path", [str(started_in), str(site)])
    paths = laneuser.python_paths()
    assert site in paths and started_in not in paths


def test_python_paths_name_this_release_s_package_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An editable install finds `orchestra_sup/` through an import hook, not the import path:
    with nothing on the path, the package directory is still bound into a lane, and not the
    checkout around it."""
    monkeypatch.setattr(sys, "path", [])
    package = Path(os.path.realpath(orchestra_sup.__file__)).parent
    paths = laneuser.python_paths()
    assert package in paths and package.parent not in paths


def test_rlimits_map_settings_and_the_cpu_grant() -> None:
    """AS, NOFILE and FSIZE from the settings, no real-time priority; CPU one second past the
    grant's seconds left (the budget stop comes first), rounded up, at least 1; none without a
    grant."""
    settings = IsolationSettings(max_memory_bytes=1 << 30, max_open_files=256, max_file_bytes=4096)
    assert rlimits(settings, None) == {
        resource.RLIMIT_AS: 1 << 30,
        resource.RLIMIT_NOFILE: 256,
        resource.RLIMIT_FSIZE: 4096,
        resource.RLIMIT_RTPRIO: 0,
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


def test_resolve_lane_user(monkeypatch: pytest.MonkeyPatch) -> None:
    """As root under bwrap, "auto" is "dynamic" where bubblewrap can hand a command to another
    uid, else "tree"; "dynamic" there is refused with the reason; under none "auto" is left for
    the custodian; not root, every setting is "tree" (and "dynamic" refused)."""
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 0)
    monkeypatch.setattr(isolation, "uid_problem", lambda: None)
    assert isolation.resolve_lane_user("auto", "bwrap") == "dynamic"
    assert isolation.resolve_lane_user("tree", "bwrap") == "tree"
    assert isolation.resolve_lane_user("auto", "none") == "auto"
    assert isolation.resolve_lane_user("dynamic", "none") == "dynamic"
    monkeypatch.setattr(isolation, "uid_problem", lambda: "setpriv fails here: no")
    assert isolation.resolve_lane_user("auto", "bwrap") == "tree"
    with pytest.raises(ConfigError, match="cannot run a lane as another uid here: setpriv fails"):
        isolation.resolve_lane_user("dynamic", "bwrap")
    monkeypatch.setattr(isolation.os, "geteuid", lambda: 1000)
    assert isolation.resolve_lane_user("auto", "bwrap") == "tree"
    with pytest.raises(ConfigError, match="only root"):
        isolation.resolve_lane_user("dynamic", "none")


def test_describe_says_which_layers_hold() -> None:
    """The transcript's first line names the hiding and the uid the lane runs as."""
    assert isolation.describe("bwrap", 1879048195) == (
        "isolation bwrap (state, run and keys directories hidden), its own uid 1879048195 "
        "(the tree's files, 0600 and 0700, closed to it)"
    )
    assert isolation.describe("none", None).startswith("isolation none (nothing hidden), the tree")
