"""`orchestra-sup systemd-unit`: the unit's text (`orchestra_sup.unit`), its sizes, and that
`systemd-analyze verify` takes every variant without a word."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra_sup.config import Settings, ShardSettings, SupervisorSettings
from orchestra_sup.shards.cgroup import KILL_TIMEOUT_S
from orchestra_sup.supervisor.root import STOP_ANNOUNCE_S, build_tree
from orchestra_sup.unit import (
    TEMPLATE_CONFIG,
    UnitSpec,
    installed_command,
    quote,
    render,
    stop_budget_s,
    unit_name,
    watchdog_sec,
)
from tests.unit.test_supervision_matrix import FakeSeam

OUTSIDE_TMP = ("/usr/bin/orchestra-sup",)
"""A program path a private /tmp does not hide (rendering never looks at it)."""


def directives(text: str) -> dict[str, list[str]]:
    """KEY -> its values in order, over the whole unit; asserts each directive's line is
    preceded by a comment (its reason)."""
    found: dict[str, list[str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not line or line.startswith(("#", "[")):
            continue
        assert lines[i - 1].startswith("# ") and len(lines[i - 1]) > 10, f"no reason for {line}"
        key, _, value = line.partition("=")
        found.setdefault(key, []).append(value)
    return found


def one(found: dict[str, list[str]], key: str) -> str:
    assert len(found.get(key, [])) == 1, (key, found.get(key))
    return found[key][0]


def test_system_unit_directives() -> None:
    """The system unit: Type=notify from the main pid, start with the workspace and config,
    SIGHUP reload, restart on failure but not after bad input (2), KillMode=mixed, delegated
    cgroups, state and run directories 0700, and the mount-namespace hardening."""
    found = directives(
        render(UnitSpec(command=OUTSIDE_TMP, workspace="/srv/ws", config="/etc/o/a.toml"))
    )
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "ExecStart": "/usr/bin/orchestra-sup start --config /etc/o/a.toml --workspace /srv/ws",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "Restart": "on-failure",
        "RestartPreventExitStatus": "2",
        "KillMode": "mixed",
        "Delegate": "yes",
        "StateDirectory": "orchestra-sup",
        "StateDirectoryMode": "0700",
        "RuntimeDirectory": "orchestra-sup",
        "RuntimeDirectoryMode": "0700",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ReadWritePaths": "-/srv/ws",
        "ProtectHome": "read-only",
        "PrivateTmp": "yes",
        "WantedBy": "multi-user.target",
        "WatchdogSec": str(watchdog_sec(Settings())),
        "TimeoutStopSec": str(stop_budget_s(Settings())),
    }
    assert {key: one(found, key) for key in expected} == expected
    for breaks_bwrap in ("RestrictNamespaces", "PrivateUsers", "SystemCallFilter", "User"):
        assert breaks_bwrap not in found


def test_bad_config_status_is_what_start_exits_with(tmp_path: Path) -> None:
    """RestartPreventExitStatus= names the status `start` really exits with on a bad config."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[supervisor]\nmax_restarts = -1\n")
    proc = subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "start", "--config", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    found = directives(render(UnitSpec(command=OUTSIDE_TMP)))
    assert "max_restarts" in proc.stderr
    assert str(proc.returncode) == one(found, "RestartPreventExitStatus")


def test_user_unit_has_no_mount_namespaces() -> None:
    """--user: WantedBy=default.target, no User=, and none of the settings a user manager can
    only honour with PrivateUsers= (which breaks bubblewrap)."""
    found = directives(render(UnitSpec(command=OUTSIDE_TMP, user=True, workspace="/home/u/ws")))
    assert one(found, "WantedBy") == "default.target"
    assert one(found, "Type") == "notify" and one(found, "Delegate") == "yes"
    for key in ("User", "ProtectSystem", "ProtectHome", "PrivateTmp", "ProtectHostname"):
        assert key not in found, key


def test_template_is_one_tree_per_instance() -> None:
    """--template: the config, state and run directories are the instance's."""
    found = directives(render(UnitSpec(command=OUTSIDE_TMP, template=True)))
    assert one(found, "ExecStart") == f"/usr/bin/orchestra-sup start --config {TEMPLATE_CONFIG}"
    assert one(found, "StateDirectory") == "orchestra-sup/%i"
    assert one(found, "RuntimeDirectory") == "orchestra-sup/%i"
    assert "%i" in one(found, "Description")
    assert unit_name(True) == "orchestra-sup@.service"


def test_a_path_in_tmp_drops_private_tmp() -> None:
    """A program, config or workspace under /tmp or /var/tmp would be hidden by PrivateTmp=,
    so the unit leaves it out and says why."""
    for spec in (
        UnitSpec(command=("/tmp/venv/bin/orchestra-sup",)),
        UnitSpec(command=OUTSIDE_TMP, config="/var/tmp/c.toml"),
        UnitSpec(command=OUTSIDE_TMP, workspace="/tmp/ws"),
    ):
        text = render(spec)
        assert "PrivateTmp" not in directives(text)
        assert "# No PrivateTmp=" in text


def test_arguments_are_quoted_for_systemd() -> None:
    """Whitespace, quotes, `$` and `\\` survive systemd's command-line parsing; `%` is literal
    in a program path and a specifier in an option given as one."""
    assert quote("/srv/my ws") == '"/srv/my ws"'
    assert quote("/a$b") == "/a$$b"
    assert quote('/a"b') == '"/a\\"b"'
    assert quote("/a\\b") == "/a\\\\b"
    assert quote("/opt/100%/bin") == "/opt/100%%/bin"
    assert quote("/srv/%i", specifiers=True) == "/srv/%i"
    found = directives(render(UnitSpec(command=("/opt/my tools/orchestra-sup",))))
    assert one(found, "ExecStart") == '"/opt/my tools/orchestra-sup" start'


@pytest.mark.parametrize("count", [1, 2, 8])
@pytest.mark.parametrize("grace", [0.0, 5.0, 30.0])
def test_stop_budget_is_above_the_longest_stop(count: int, grace: float) -> None:
    """TimeoutStopSec= exceeds the worst stop of the tree `build_tree` makes: the announcement,
    a retiring shard generation, every child's own shutdown grace in turn, the cgroup kill."""
    settings = Settings(
        supervisor=SupervisorSettings(shutdown_timeout_s=grace),
        shards=ShardSettings(count=count),
    )
    workers = list(build_tree(settings, FakeSeam(), lambda: None).workers())
    graces = [w.spec.shutdown_s or 0.0 for w in workers]
    retiring = max(w.spec.shutdown_s or 0.0 for w in workers if w.spec.role == "shard")
    assert stop_budget_s(settings) > STOP_ANNOUNCE_S + retiring + sum(graces) + KILL_TIMEOUT_S


def test_watchdog_sec_follows_the_childrens_watchdog() -> None:
    """WatchdogSec= is twice [supervisor] watchdog_s, never below 30 s."""
    assert watchdog_sec(Settings()) == 30
    long = Settings(supervisor=SupervisorSettings(watchdog_s=40.0))
    assert watchdog_sec(long) == 80


def test_installed_command_is_this_installation() -> None:
    """ExecStart's program is this interpreter's orchestra-sup, an absolute path that runs."""
    command = installed_command()
    assert Path(command[0]).is_absolute()
    proc = subprocess.run([*command, "version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip()


ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
@pytest.mark.parametrize("template", [False, True], ids=["plain", "template"])
@pytest.mark.parametrize("where", ["installed", "python3"])
def test_systemd_analyze_verify_says_nothing(
    tmp_path: Path, user: bool, template: bool, where: str
) -> None:
    """`systemd-analyze verify` accepts every variant with an empty stderr (unknown keys and bad
    values are only warnings there): this installation's program, and /usr/bin/python3 -m
    orchestra_sup (a program outside /tmp: PrivateTmp= on), with a workspace whose name needs
    quoting."""
    if where == "installed":
        command = installed_command()
    elif os.access("/usr/bin/python3", os.X_OK):
        command = ("/usr/bin/python3", "-m", "orchestra_sup")
    else:
        pytest.skip("no /usr/bin/python3")
    spec = UnitSpec(command=command, user=user, template=template, workspace="/srv/a $b")
    path = tmp_path / unit_name(template)
    path.write_text(render(spec))
    target = path.with_name("orchestra-sup@demo.service") if template else path
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))  # a user manager's, for --user
    argv = [ANALYZE, *(["--user"] if user else []), "verify", str(target)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
def test_verify_would_catch_a_bad_key(tmp_path: Path) -> None:
    """The check above can fail: a misspelt directive is a warning on stderr."""
    path = tmp_path / "orchestra-sup.service"
    path.write_text(render(UnitSpec(command=installed_command())).replace("KillMode", "KilMode"))
    proc = subprocess.run([ANALYZE, "verify", str(path)], capture_output=True, text=True)
    assert "KilMode" in proc.stderr


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestra_sup", "systemd-unit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_cli_sizes_the_unit_from_the_config(tmp_path: Path) -> None:
    """`systemd-unit --config C --workspace W` starts with C and W (absolute) and sizes
    TimeoutStopSec= and WatchdogSec= from C."""
    config = tmp_path / "c.toml"
    config.write_text("[supervisor]\nshutdown_timeout_s = 20.0\nwatchdog_s = 40.0\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    proc = cli("--config", "c.toml", "--workspace", "ws", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    found = directives(proc.stdout)
    settings = Settings(supervisor=SupervisorSettings(shutdown_timeout_s=20.0, watchdog_s=40.0))
    assert one(found, "TimeoutStopSec") == str(stop_budget_s(settings))
    assert one(found, "WatchdogSec") == "80"
    assert f"--config {config} --workspace {ws}" in one(found, "ExecStart")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--config", "/nonexistent/c.toml"], "No such file"),
        (["--workspace", "/nonexistent/ws"], "not a directory"),
    ],
)
def test_cli_bad_input_is_one_line(args: list[str], needle: str) -> None:
    """A config that cannot be read or a workspace that is not there: one line, status 2."""
    proc = cli(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr


def injecting(tmp_path: Path) -> Path:
    """A directory whose path holds a newline and a directive after it, with a valid config
    file in it: what `systemd-unit` once wrote into the unit as a line of its own."""
    where = tmp_path / f"ws\nExecStartPre=/bin/touch {tmp_path}/pwned"
    where.mkdir(parents=True)
    (where / "c.toml").write_text("[supervisor]\nwatchdog_s = 10.0\n")
    return where


@pytest.mark.parametrize(
    ("option", "name"),
    [("--workspace", None), ("--config", "c.toml"), ("--config", "missing.toml")],
)
def test_cli_refuses_a_path_that_would_inject_a_directive(
    tmp_path: Path, option: str, name: str | None
) -> None:
    """`systemd-unit --workspace` / `--config` with a newline + `ExecStartPre=...` in the
    path (a config there or not): status 2, one line naming the option and showing the path
    escaped, no unit."""
    where = injecting(tmp_path)
    value = str(where if name is None else where / name)
    proc = cli(option, value)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stdout
    assert proc.stderr.splitlines() == [
        f"orchestra-sup: {option} {value!r}: holds a control character "
        f"(U+000A at index {value.index(chr(10))}); a path may not"
    ]
