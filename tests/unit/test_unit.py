"""`orchestra-sup systemd-unit`: the unit's text (`orchestra_sup.cli.unit`), its sizes, and that
`systemd-analyze verify` takes every variant without a word."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from orchestra_sup.cli.unit import (
    TEMPLATE_CONFIG,
    UnitSpec,
    exec_word,
    installed_command,
    path_word,
    render,
    stop_budget_s,
    unit_name,
    watchdog_sec,
)
from orchestra_sup.config import Settings, ShardSettings, SupervisorSettings, settings_from_mapping
from orchestra_sup.errors import ConfigError
from orchestra_sup.supervisor.root import STOP_ANNOUNCE_S
from orchestra_sup.supervisor.shape import build_tree
from orchestra_sup.system.cgroups import KILL_TIMEOUT_S
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
    in a program path and a specifier in an option given as one; `$` is doubled on a command
    line only (a path list expands no variables)."""
    assert exec_word("/srv/my ws") == '"/srv/my ws"'
    assert exec_word("/a$b") == "/a$$b"
    assert exec_word('/a"b') == '"/a\\"b"'
    assert exec_word("/a\\b") == '"/a\\\\b"'
    assert exec_word("/opt/100%/bin") == "/opt/100%%/bin"
    assert exec_word("/srv/%i", specifiers=True) == "/srv/%i"
    assert exec_word(";") == '";"'
    assert exec_word("") == '""'
    assert path_word("/a$b", prefix="-") == "-/a$b"
    assert path_word("/srv/my ws", prefix="-") == '"-/srv/my ws"'
    found = directives(render(UnitSpec(command=("/opt/my tools/orchestra-sup",))))
    assert one(found, "ExecStart") == '"/opt/my tools/orchestra-sup" start'


# systemd's documented unquoting, to read a rendered unit back as systemd does: systemd.syntax(7)
# "Quoting", systemd.unit(5) "Specifiers", systemd.service(5) "Command lines".
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_ESCAPES |= {"\\": "\\", '"': '"', "'": "'", "s": " "}
_NUMERIC = {"x": (16, 2), "u": (16, 4), "U": (16, 8)}


def unquote_words(text: str) -> list[tuple[str, bool]]:
    """`text` split into (item, was quoted): items are separated by unquoted whitespace; a
    double- or single-quoted item's quote opens it and its closing quote is followed by
    whitespace or the end; C-style escapes (the table in systemd.syntax(7)) inside quotes and
    out. Anything else is a syntax error (AssertionError)."""
    words: list[tuple[str, bool]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t":
            i += 1
        if i == n:
            return words
        quote = text[i] if text[i] in "\"'" else None
        i += quote is not None
        word: list[str] = []
        while True:
            if i == n:
                assert quote is None, f"unterminated quote in {text!r}"
                break
            char = text[i]
            if char == quote:
                i += 1
                assert i == n or text[i] in " \t", f"quote closed mid-word in {text!r}"
                break
            if quote is None and char in " \t":
                break
            assert quote is not None or char not in "\"'", f"a quote mid-word in {text!r}"
            if char != "\\":
                word.append(char)
                i += 1
                continue
            assert i + 1 < n, f"a trailing backslash in {text!r}"
            code = text[i + 1]
            if code in _ESCAPES:
                word.append(_ESCAPES[code])
                i += 2
            elif code in _NUMERIC or code in "01234567":
                base, width = _NUMERIC.get(code, (8, 3))
                start = i + 2 if code in _NUMERIC else i + 1
                word.append(chr(int(text[start : start + width], base)))
                i = start + width
            else:
                raise AssertionError(f"unknown escape \\{code} in {text!r}")
        words.append(("".join(word), quote is not None))


def expand_specifiers(word: str, instance: str) -> str:
    """`%%` and `%i` (the only specifiers these tests use) expanded; any other is an error."""

    def one(match: re.Match[str]) -> str:
        assert match.group(1) in ("%", "i"), f"specifier %{match.group(1)} in {word!r}"
        return "%" if match.group(1) == "%" else instance

    assert not re.search(r"%$", re.sub(r"%.", "", word)), f"a lone % in {word!r}"
    return re.sub(r"%(.)", one, word)


def exec_argv(value: str, instance: str = "") -> list[str]:
    """The argv systemd runs for an `ExecStart=` value: unquoted, no unquoted `;` (a second
    command), specifiers expanded; in the arguments (not the program, which is never a
    variable) `$$` made `$` and any other `$` (a variable) an error."""
    argv: list[str] = []
    for word, quoted in unquote_words(value):
        assert quoted or word != ";", f"a second command in {value!r}"
        word = expand_specifiers(word, instance)
        if argv:
            assert "$" not in word.replace("$$", ""), f"a variable in {word!r}"
            word = word.replace("$$", "$")
        argv.append(word)
    return argv


HOSTILE = (
    "/srv/my ws",
    "/srv/'single' \"double\"",
    "/srv/back\\slash\\",
    "/srv/100% %i %h %% $HOME ${HOME} $$",
    ";",
    "\\;",
    "",
    " leading and trailing ",
    "/srv/#not a comment;=",
    "/srv/ünïcödé €",
)
"""Words that mean something to systemd's parser, none a control character."""
WORKSPACE = "/srv/ws 100%%/%i/'q' \"d\" \\ $X ${X} ü"
"""A workspace as `--workspace` takes it (specifiers: a literal % is %%)."""
CONFIG = '/etc/o;/%i \\"$.toml'


def hostile_spec(program: str) -> UnitSpec:
    return UnitSpec(command=(program, *HOSTILE), template=True, workspace=WORKSPACE, config=CONFIG)


def test_hostile_values_read_back_as_themselves() -> None:
    """Spaces, both quotes, backslashes (a trailing one too), `%`, `$`, `${..}`, `;`, `#`,
    an empty word and non-ASCII letters: systemd's documented unquoting of ExecStart= gives
    back exactly the argv asked for (specifiers in the workspace and config expanded), and
    ReadWritePaths= exactly the workspace; no line of the unit ends in a backslash."""
    program = "/opt/100% $HOME ${HOME} $$ ü;#=/orchestra-sup"
    text = render(hostile_spec(program))
    found = directives(text)
    expected = [program, *HOSTILE, "start"]
    expected += ["--config", CONFIG.replace("%i", "demo")]
    expected += ["--workspace", WORKSPACE.replace("%%", "%").replace("%i", "demo")]
    assert exec_argv(one(found, "ExecStart"), "demo") == expected
    [(item, _)] = unquote_words(one(found, "ReadWritePaths"))
    assert item.startswith("-")
    assert expand_specifiers(item[1:], "demo") == expected[-1]
    assert not [line for line in text.splitlines() if line.endswith("\\")]


@pytest.mark.parametrize(
    "bad",
    [
        "/srv/ws\nExecStartPre=/bin/touch /tmp/pwned",
        "/srv/\r",
        "/srv/\x00",
        "/srv/\x1b[2J",
        "/srv/\x85",
        "/srv/\u2028",
        "/srv/\t",
    ],
    ids=["newline", "cr", "nul", "esc", "nel", "u2028", "tab"],
)
@pytest.mark.parametrize("field", ["workspace", "config", "command"])
def test_a_control_character_is_refused_not_written(field: str, bad: str) -> None:
    """A control character (or U+2028) in any value of the unit: `render` raises one line
    naming it and showing the value escaped, instead of writing a line of its own."""
    values = {"command": (OUTSIDE_TMP[0], bad)} if field == "command" else {field: bad}
    with pytest.raises(ConfigError) as caught:
        render(UnitSpec(**{"command": OUTSIDE_TMP, **values}))  # type: ignore[arg-type]
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and repr(bad)[1:-1] in message
    assert {"command": "the orchestra-sup command"}.get(field, f"--{field}") in message


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        ("/srv/caf\udce9", "not UTF-8"),
        ("/srv/50%", "write a literal one as %%"),
        ("/srv/%", "starts no systemd specifier"),
        ("/srv/a%zb", "starts no systemd specifier"),  # a letter systemd has no specifier for
        ("/srv/%K", "starts no systemd specifier"),
    ],
)
def test_values_no_quoting_carries_are_refused(value: str, needle: str) -> None:
    """Text that is not UTF-8 (a unit must be; systemd ignores such a line), or a `%` that
    starts no specifier where specifiers are allowed: one line naming the option."""
    with pytest.raises(ConfigError, match=re.escape(needle)) as caught:
        render(UnitSpec(command=OUTSIDE_TMP, workspace=value))
    assert str(caught.value).startswith("--workspace ")


@pytest.mark.parametrize(
    ("program", "needle"),
    [
        ("-orchestra-sup", "not an absolute path"),
        ("/opt/it's/orchestra-sup", "a quote or a backslash"),
        ('/opt/"q"/orchestra-sup', "a quote or a backslash"),
        ("/opt/a\\b/orchestra-sup", "a quote or a backslash"),
    ],
)
def test_a_program_systemd_cannot_run_is_refused(program: str, needle: str) -> None:
    """The program must be absolute (a leading `-` or `@` would be one of systemd's flags),
    with no quote or backslash (systemd will not load such a unit)."""
    with pytest.raises(ConfigError, match=needle):
        render(UnitSpec(command=(program,)))


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
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_systemd_analyze_verify_takes_hostile_values(tmp_path: Path, user: bool) -> None:
    """The unit of `test_hostile_values_read_back_as_themselves`, its program a real one in a
    directory whose name has `%`, `$`, `;`, `#`, spaces and non-ASCII letters:
    `systemd-analyze verify` says nothing (it would name the program as it parsed it, were
    that not an executable, and warn of a bad escape, specifier or second command)."""
    where = tmp_path / "bin 100% %i $HOME ${HOME} $$ ü;#="
    where.mkdir()
    program = where / "orchestra-sup"
    program.symlink_to(sys.executable)
    spec = msgspec.structs.replace(hostile_spec(str(program)), user=user)
    (tmp_path / unit_name(True)).write_text(render(spec))
    target = tmp_path / "orchestra-sup@demo.service"
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    argv = [ANALYZE, *(["--user"] if user else []), "verify", str(target)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    program.unlink()  # the same check, with the program gone, names it as systemd read it
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert f"Command {program} is not executable" in proc.stderr


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


REALTIME = settings_from_mapping(
    {"cpu": {"realtime": "auto", "rt_priority": 7, "rttime_s": 0.5, "reserved_cpus": "0"}}
)


def test_the_cpu_policy_s_directives_follow_the_config() -> None:
    """[cpu] realtime off: RestrictRealtime=yes, nothing else. On: the limits that let the
    tree take real time (up to the guard's priority, one above the tree's), RLIMIT_RTTIME as
    the supervisor sets it, the reserved CPUs; no RestrictRealtime=, which would forbid it."""
    plain = directives(render(UnitSpec(command=OUTSIDE_TMP)))
    assert one(plain, "RestrictRealtime") == "yes"
    for key in ("LimitRTPRIO", "LimitRTTIME", "CPUAffinity", "CPUSchedulingPolicy"):
        assert key not in plain, key
    found = directives(render(UnitSpec(command=OUTSIDE_TMP, settings=REALTIME)))
    assert one(found, "LimitRTPRIO") == "8"
    assert one(found, "LimitRTTIME") == "500000:1500000"
    assert one(found, "CPUAffinity") == "0"
    assert "RestrictRealtime" not in found and "CPUSchedulingPolicy" not in found
    user = directives(render(UnitSpec(command=OUTSIDE_TMP, user=True, settings=REALTIME)))
    assert "LimitRTPRIO" not in user and one(user, "LimitRTTIME") == "500000:1500000"


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_systemd_analyze_verify_takes_the_cpu_policy(tmp_path: Path, user: bool) -> None:
    spec = UnitSpec(command=installed_command(), user=user, settings=REALTIME)
    path = tmp_path / unit_name(False)
    path.write_text(render(spec))
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    argv = [ANALYZE, *(["--user"] if user else []), "verify", str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr


HOST_WORDS = ("--join", "tcp://10.0.0.2:7450", "--keys", "/etc/orchestra-sup/keys", "--name", "a")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_a_hosts_unit_runs_its_agent_and_verifies(tmp_path: Path, user: bool) -> None:
    """`systemd-unit --host`: `orchestra-sup host` with its options, after the network is
    configured, no reload, its own state and run directories; systemd-analyze says nothing."""
    spec = UnitSpec(command=installed_command(), user=user, host=HOST_WORDS)
    text = render(spec)
    (start,) = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert start.endswith(" host " + " ".join(HOST_WORDS))
    assert "Wants=network-online.target" in text and "\nExecReload=" not in text
    assert "StateDirectory=orchestra-sup-host\n" in text
    assert "RuntimeDirectory=orchestra-sup-host\n" in text
    path = tmp_path / unit_name(False, host=True)
    path.write_text(text)
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    argv = [ANALYZE, *(["--user"] if user else []), "verify", str(path)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr


def test_a_hosts_unit_keeps_its_keys_out_of_a_private_tmp() -> None:
    """Keys under /tmp: no PrivateTmp=, which would hide them from the agent."""
    words = ("--join", "tcp://r:1", "--keys", "/tmp/k", "--name", "a")
    text = render(UnitSpec(command=installed_command(), host=words))
    assert "PrivateTmp=" not in text.replace("# No PrivateTmp=", "")
    with pytest.raises(ConfigError, match="a host's unit has no --template"):
        render(UnitSpec(command=installed_command(), host=words, template=True))
