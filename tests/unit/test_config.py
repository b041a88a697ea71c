"""Tests for `orchestra_sup.config`: settings validation and where a tree keeps its files."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from orchestra_sup.config import (
    ISOLATION_ENV,
    LANE_USER_ENV,
    LaneSettings,
    Settings,
    ShardSettings,
    SupervisorSettings,
    load_settings,
    settings_from_mapping,
)
from orchestra_sup.errors import ConfigError
from orchestra_sup.paths import (
    IPC_PATH_MAX,
    Paths,
    default_run_dir,
    default_state_dir,
    resolve_paths,
)

ENV_VARS = (
    "ORCHESTRA_SUP_RUN_DIR",
    "RUNTIME_DIRECTORY",
    "XDG_RUNTIME_DIR",
    "STATE_DIRECTORY",
    "XDG_STATE_HOME",
)


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No path-related variable set, and HOME pointing at a scratch directory."""
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "orchestra.toml"
    path.write_text(text)
    return path


def _refused(tmp_path: Path, text: str, **overrides: int) -> str:
    path = _toml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, **overrides)
    message = str(info.value)
    assert str(path) in message
    return message


# --- settings ------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_isolation_override(monkeypatch: pytest.MonkeyPatch) -> None:
    """Config as the file says: tests/conftest.py sets `ISOLATION_ENV` and `LANE_USER_ENV` for
    the trees."""
    monkeypatch.delenv(ISOLATION_ENV, raising=False)
    monkeypatch.delenv(LANE_USER_ENV, raising=False)


def test_defaults_without_a_file() -> None:
    """With no file and no flags, every setting has its documented default."""
    s = load_settings(None)
    assert s == Settings()
    assert s.supervisor == SupervisorSettings(
        max_restarts=5,
        max_seconds=30.0,
        shutdown_timeout_s=5.0,
        watchdog_s=10.0,
        backoff_initial_s=0.1,
        backoff_max_s=5.0,
    )
    assert s.shards == ShardSettings(count=2, lanes_per_shard=8)
    assert s.lanes == LaneSettings(max_worker_loss=3)


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    """An empty config file is valid and gives the defaults."""
    assert load_settings(_toml(tmp_path, "")) == Settings()


def test_file_values_are_read(tmp_path: Path) -> None:
    """Every key of every section is read from the file; ints are accepted for float keys and
    become floats."""
    path = _toml(
        tmp_path,
        """
        [supervisor]
        max_restarts = 2
        max_seconds = 10
        shutdown_timeout_s = 1.5
        watchdog_s = 3.0
        backoff_initial_s = 0.5
        backoff_max_s = 2.0

        [shards]
        count = 3
        lanes_per_shard = 16

        [lanes]
        max_worker_loss = 5
        """,
    )
    s = load_settings(path)
    assert s.supervisor == SupervisorSettings(
        max_restarts=2,
        max_seconds=10.0,
        shutdown_timeout_s=1.5,
        watchdog_s=3.0,
        backoff_initial_s=0.5,
        backoff_max_s=2.0,
    )
    assert type(s.supervisor.max_seconds) is float
    assert s.shards == ShardSettings(count=3, lanes_per_shard=16)
    assert s.lanes == LaneSettings(max_worker_loss=5)


def test_lanes_section_alone(tmp_path: Path) -> None:
    """A file with only [lanes] sets max_worker_loss and keeps every other default; the CLI
    overrides leave it alone."""
    s = load_settings(_toml(tmp_path, "[lanes]\nmax_worker_loss = 1\n"), shards=3)
    assert s.lanes == LaneSettings(max_worker_loss=1)
    assert s.shards == ShardSettings(count=3, lanes_per_shard=8)
    assert s.supervisor == SupervisorSettings()


def test_partial_section_keeps_other_defaults(tmp_path: Path) -> None:
    """Keys left out of a section keep their defaults."""
    s = load_settings(_toml(tmp_path, "[shards]\ncount = 5\n"))
    assert s.shards == ShardSettings(count=5, lanes_per_shard=8)
    assert s.supervisor == SupervisorSettings()


def test_cli_overrides_without_a_file() -> None:
    """The --shards and --lanes-per-shard overrides apply on top of the defaults."""
    s = load_settings(None, shards=4, lanes_per_shard=3)
    assert s.shards == ShardSettings(count=4, lanes_per_shard=3)
    assert s.supervisor == SupervisorSettings()


def test_cli_overrides_beat_the_file(tmp_path: Path) -> None:
    """A CLI override wins over the file's value; an override left None keeps the file's."""
    path = _toml(tmp_path, "[shards]\ncount = 2\nlanes_per_shard = 6\n")
    s = load_settings(path, shards=7)
    assert s.shards == ShardSettings(count=7, lanes_per_shard=6)


def test_cli_override_is_validated() -> None:
    """An out-of-range CLI override is refused like a file value, naming the key and value."""
    with pytest.raises(ConfigError) as info:
        load_settings(None, shards=0)
    assert "count" in str(info.value)
    assert "0" in str(info.value)
    assert not str(info.value).startswith("config ")


BAD_VALUES = [
    # (case, toml text, key, value as it should appear)
    ("string for int", '[supervisor]\nmax_restarts = "5"\n', "max_restarts", '"5"'),
    ("bool for int", "[shards]\ncount = true\n", "count", "true"),
    ("bool for float", "[supervisor]\nmax_seconds = false\n", "max_seconds", "false"),
    ("float for int", "[shards]\nlanes_per_shard = 2.5\n", "lanes_per_shard", "2.5"),
    ("array for int", "[shards]\ncount = [1]\n", "count", "[1]"),
    ("string for float", '[supervisor]\nwatchdog_s = "10s"\n', "watchdog_s", '"10s"'),
    ("int below range", "[shards]\ncount = 0\n", "count", "0"),
    ("int above range", "[shards]\ncount = 257\n", "count", "257"),
    ("negative", "[supervisor]\nmax_restarts = -1\n", "max_restarts", "-1"),
    ("float below range", "[supervisor]\nwatchdog_s = 0.05\n", "watchdog_s", "0.05"),
    ("float above range", "[supervisor]\nmax_seconds = 86401.0\n", "max_seconds", "86401.0"),
    ("nan", "[supervisor]\nmax_seconds = nan\n", "max_seconds", "nan"),
    ("infinity", "[supervisor]\nshutdown_timeout_s = inf\n", "shutdown_timeout_s", "inf"),
    ("max_worker_loss zero", "[lanes]\nmax_worker_loss = 0\n", "max_worker_loss", "0"),
    ("max_worker_loss above", "[lanes]\nmax_worker_loss = 101\n", "max_worker_loss", "101"),
    ("max_worker_loss negative", "[lanes]\nmax_worker_loss = -3\n", "max_worker_loss", "-3"),
    ("max_worker_loss float", "[lanes]\nmax_worker_loss = 2.0\n", "max_worker_loss", "2.0"),
    ("max_worker_loss bool", "[lanes]\nmax_worker_loss = true\n", "max_worker_loss", "true"),
    ("max_worker_loss string", '[lanes]\nmax_worker_loss = "3"\n', "max_worker_loss", '"3"'),
]


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [row[1:] for row in BAD_VALUES],
    ids=[row[0] for row in BAD_VALUES],
)
def test_bad_value_names_key_and_value(tmp_path: Path, text: str, key: str, value: str) -> None:
    """A value of the wrong type or out of range raises ConfigError naming the file, the key and
    the value."""
    message = _refused(tmp_path, text)
    assert f"{key} = {value}" in message


@pytest.mark.parametrize(
    ("key", "low", "high"),
    [
        ("supervisor.max_restarts", 0, 10_000),
        ("supervisor.max_seconds", 0.001, 86_400),
        ("supervisor.shutdown_timeout_s", 0, 3_600),
        ("supervisor.watchdog_s", 0.1, 3_600),
        ("supervisor.backoff_initial_s", 0, 60),
        ("shards.count", 1, 256),
        ("shards.lanes_per_shard", 1, 100_000),
        ("lanes.max_worker_loss", 1, 100),
    ],
)
def test_range_bounds_are_inclusive(key: str, low: float, high: float) -> None:
    """Each key accepts both ends of its documented range."""
    section, name = key.split(".")
    for value in (low, high):
        body = {name: value}
        if name == "backoff_initial_s":
            body["backoff_max_s"] = max(value, 5.0)
        s = settings_from_mapping({section: body})
        assert getattr(getattr(s, section), name) == value


def test_unknown_section(tmp_path: Path) -> None:
    """An unknown section raises ConfigError naming it."""
    message = _refused(tmp_path, "[supervisr]\nmax_restarts = 1\n")
    assert "[supervisr]" in message


def test_unknown_key(tmp_path: Path) -> None:
    """An unknown key raises ConfigError naming the section and the key."""
    message = _refused(tmp_path, "[shards]\nlanes = 4\n")
    assert "[shards]" in message
    assert "'lanes'" in message


def test_unknown_lanes_key(tmp_path: Path) -> None:
    """An unknown key in [lanes] raises ConfigError naming it and the known key."""
    message = _refused(tmp_path, "[lanes]\nmax_worker_losses = 2\n")
    assert "[lanes]" in message
    assert "'max_worker_losses'" in message
    assert "(known: max_worker_loss, nice, programs)" in message


def test_unknown_section_lists_lanes(tmp_path: Path) -> None:
    """The unknown-section error names every known section, [lanes] included."""
    message = _refused(tmp_path, "[lane]\nmax_worker_loss = 2\n")
    assert "[lane]" in message
    assert "[supervisor], [shards], [lanes]" in message


def test_lanes_not_a_table(tmp_path: Path) -> None:
    """[lanes] given as a plain value raises ConfigError naming it and the value."""
    message = _refused(tmp_path, "lanes = 3\n")
    assert "[lanes]" in message
    assert "3" in message


def test_key_of_the_other_section_is_unknown(tmp_path: Path) -> None:
    """A real key in the wrong section is unknown there."""
    message = _refused(tmp_path, "[shards]\nmax_restarts = 4\n")
    assert "'max_restarts'" in message


def test_section_that_is_not_a_table(tmp_path: Path) -> None:
    """A section given as a plain value raises ConfigError naming it and the value."""
    message = _refused(tmp_path, "shards = 2\n")
    assert "[shards]" in message
    assert "2" in message


def test_backoff_max_below_initial(tmp_path: Path) -> None:
    """backoff_max_s below backoff_initial_s raises ConfigError naming both keys and values."""
    message = _refused(tmp_path, "[supervisor]\nbackoff_initial_s = 2.0\nbackoff_max_s = 1.0\n")
    assert "backoff_max_s = 1.0" in message
    assert "backoff_initial_s = 2.0" in message


def test_backoff_max_equal_to_initial_is_fine() -> None:
    """backoff_max_s equal to backoff_initial_s is allowed (a constant delay)."""
    s = settings_from_mapping({"supervisor": {"backoff_initial_s": 1.0, "backoff_max_s": 1.0}})
    assert s.supervisor.backoff_max_s == s.supervisor.backoff_initial_s == 1.0


def test_invalid_toml_names_path(tmp_path: Path) -> None:
    """A file that is not TOML raises ConfigError naming the path."""
    _refused(tmp_path, "[supervisor\nmax_restarts = = 3\n")


def test_missing_file_names_path(tmp_path: Path) -> None:
    """A config file that does not exist raises ConfigError naming the path and the reason."""
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(path) in str(info.value)
    assert "No such file" in str(info.value)


def test_directory_as_file_names_path(tmp_path: Path) -> None:
    """A config path that is a directory raises ConfigError naming the path."""
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_non_utf8_file_names_path(tmp_path: Path) -> None:
    """A config file that is not UTF-8 (so not TOML) raises ConfigError naming the path."""
    path = tmp_path / "latin1.toml"
    path.write_bytes(b"# r\xe9glages\n[shards]\ncount = 2\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert str(path) in str(info.value)


def test_override_with_shards_not_a_table(tmp_path: Path) -> None:
    """A file whose `shards` is a plain value is refused with ConfigError even with --shards."""
    _refused(tmp_path, "shards = 2\n", shards=3)


# --- paths ---------------------------------------------------------------------------------------


def test_resolve_paths_makes_everything_absolute(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Relative state, run and workspace paths are made absolute against the current directory."""
    (tmp_path / "ws").mkdir()
    clean_env.chdir(tmp_path)
    paths = resolve_paths(Path("state"), Path("run"), Path("ws"))
    assert paths == Paths(
        state_dir=tmp_path / "state", run_dir=tmp_path / "run", workspace=tmp_path / "ws"
    )
    assert paths.endpoint("shard-0") == f"ipc://{tmp_path / 'run' / 'shard-0.ipc'}"


def test_resolve_paths_defaults(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without arguments the env-derived defaults are used and the workspace stays None."""
    clean_env.setenv("ORCHESTRA_SUP_RUN_DIR", str(tmp_path / "r"))
    clean_env.setenv("STATE_DIRECTORY", str(tmp_path / "s"))
    assert resolve_paths(None, None, None) == Paths(
        state_dir=tmp_path / "s", run_dir=tmp_path / "r", workspace=None
    )


def test_run_dir_too_long(tmp_path: Path) -> None:
    """A run directory whose socket paths would pass IPC_PATH_MAX raises ConfigError naming it."""
    run = Path("/tmp") / ("x" * (IPC_PATH_MAX - len("/tmp/") - len("/coordinator.ipc") + 1))
    with pytest.raises(ConfigError) as info:
        resolve_paths(tmp_path, run, None)
    assert str(run) in str(info.value)
    assert "too long" in str(info.value)


def test_run_dir_at_the_limit_is_fine(tmp_path: Path) -> None:
    """A run directory whose longest socket path is exactly IPC_PATH_MAX is accepted."""
    run = Path("/tmp") / ("x" * (IPC_PATH_MAX - len("/tmp/") - len("/coordinator.ipc")))
    assert len(str(run / "coordinator.ipc")) == IPC_PATH_MAX
    assert resolve_paths(tmp_path, run, None).run_dir == run


def test_run_dir_too_long_in_bytes(tmp_path: Path) -> None:
    """The socket-path limit counts bytes: a short-looking non-ASCII run dir is refused."""
    run = Path("/tmp") / ("é" * 50)
    assert len(str(run / "coordinator.ipc")) <= IPC_PATH_MAX
    assert len(os.fsencode(run / "coordinator.ipc")) > 107
    with pytest.raises(ConfigError):
        resolve_paths(tmp_path, run, None)


def test_workspace_missing(tmp_path: Path) -> None:
    """A workspace that does not exist raises ConfigError naming it."""
    ws = tmp_path / "missing"
    with pytest.raises(ConfigError) as info:
        resolve_paths(tmp_path / "s", tmp_path / "r", ws)
    assert str(ws) in str(info.value)
    assert "does not exist" in str(info.value)


def test_workspace_is_a_file(tmp_path: Path) -> None:
    """A workspace that is a file raises ConfigError naming it."""
    ws = tmp_path / "file"
    ws.write_text("not a dir")
    with pytest.raises(ConfigError) as info:
        resolve_paths(tmp_path / "s", tmp_path / "r", ws)
    assert str(ws) in str(info.value)
    assert "not a directory" in str(info.value)


RUN_DIR_TABLE = [
    # (case, env, expected; "{uid}" is replaced by the real uid)
    (
        "ORCHESTRA_SUP_RUN_DIR wins",
        {
            "ORCHESTRA_SUP_RUN_DIR": "/o",
            "RUNTIME_DIRECTORY": "/r",
            "XDG_RUNTIME_DIR": "/x",
        },
        "/o",
    ),
    ("RUNTIME_DIRECTORY next", {"RUNTIME_DIRECTORY": "/r", "XDG_RUNTIME_DIR": "/x"}, "/r"),
    ("RUNTIME_DIRECTORY first of a list", {"RUNTIME_DIRECTORY": "/r1:/r2"}, "/r1"),
    ("XDG_RUNTIME_DIR next", {"XDG_RUNTIME_DIR": "/x"}, "/x/orchestra-sup"),
    ("nothing set", {}, "/tmp/orchestra-sup-{uid}"),
    (
        "empty values are ignored",
        {"ORCHESTRA_SUP_RUN_DIR": "", "RUNTIME_DIRECTORY": "", "XDG_RUNTIME_DIR": "/x"},
        "/x/orchestra-sup",
    ),
    ("all empty", {"ORCHESTRA_SUP_RUN_DIR": "", "XDG_RUNTIME_DIR": ""}, "/tmp/orchestra-sup-{uid}"),
]


@pytest.mark.parametrize(
    ("env", "expected"),
    [row[1:] for row in RUN_DIR_TABLE],
    ids=[row[0] for row in RUN_DIR_TABLE],
)
def test_default_run_dir(clean_env: pytest.MonkeyPatch, env: dict[str, str], expected: str) -> None:
    """default_run_dir: ORCHESTRA_SUP_RUN_DIR > RUNTIME_DIRECTORY > XDG_RUNTIME_DIR >
    /tmp/orchestra-sup-<uid>."""
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert default_run_dir() == Path(expected.format(uid=os.getuid()))


STATE_DIR_TABLE = [
    ("STATE_DIRECTORY wins", {"STATE_DIRECTORY": "/s", "XDG_STATE_HOME": "/x"}, "/s"),
    ("STATE_DIRECTORY first of a list", {"STATE_DIRECTORY": "/s1:/s2"}, "/s1"),
    ("XDG_STATE_HOME next", {"XDG_STATE_HOME": "/x"}, "/x/orchestra-sup"),
    (
        "empty STATE_DIRECTORY ignored",
        {"STATE_DIRECTORY": "", "XDG_STATE_HOME": "/x"},
        "/x/orchestra-sup",
    ),
    ("nothing set", {}, "{home}/.local/state/orchestra-sup"),
]


@pytest.mark.parametrize(
    ("env", "expected"),
    [row[1:] for row in STATE_DIR_TABLE],
    ids=[row[0] for row in STATE_DIR_TABLE],
)
def test_default_state_dir(
    clean_env: pytest.MonkeyPatch, tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    """default_state_dir: STATE_DIRECTORY > XDG_STATE_HOME/orchestra-sup >
    ~/.local/state/orchestra-sup."""
    for name, value in env.items():
        clean_env.setenv(name, value)
    assert default_state_dir() == Path(expected.format(home=tmp_path / "home"))


# --- [shards] capabilities, tenants and per-shard tables ------------------------------------------


def test_capabilities_and_tenants_for_all_shards_and_one() -> None:
    """`[shards]` lists apply to every shard; a `[shards.shard-N]` table replaces only the lists
    it names."""
    s = settings_from_mapping(
        {
            "shards": {
                "count": 3,
                "capabilities": ["py", "git", "py"],
                "tenants": ["acme"],
                "shard-2": {"capabilities": ["gpu"]},
                "shard-1": {"tenants": []},
            }
        }
    )
    assert s.shards.offers("shard-0") == (("py", "git"), ("acme",))
    assert s.shards.offers("shard-1") == (("py", "git"), ())
    assert s.shards.offers("shard-2") == (("gpu",), ("acme",))


def test_default_shards_offer_nothing_and_serve_everyone() -> None:
    assert Settings().shards.offers("shard-0") == ((), ())


@pytest.mark.parametrize(
    ("shards", "expected"),
    [
        ({"capabilities": "gpu"}, '[shards] capabilities = "gpu": expected an array of names'),
        ({"tenants": ["a b"]}, '[shards] tenants: "a b" is not a name'),
        ({"capabilities": [3]}, "[shards] capabilities: 3 is not a name"),
        ({"shard-5": {"capabilities": []}}, "[shards.shard-5]: there is no such shard (count = 2"),
        ({"gpu-box": {"capabilities": []}}, "[shards.gpu-box]: not a shard name"),
        ({"shard-0": {"count": 1}}, "[shards.shard-0] unknown key 'count'"),
        ({"shard-0": {"tenants": "acme"}}, '[shards.shard-0] tenants = "acme": expected an array'),
    ],
)
def test_bad_shard_lists_are_refused_by_name(shards: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings_from_mapping({"shards": shards})
    assert expected in str(info.value)
    assert "\n" not in str(info.value)


def test_per_shard_table_from_a_toml_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[shards]\ncount = 2\n[shards.shard-1]\ncapabilities = ["gpu"]\n')
    assert load_settings(path).shards.offers("shard-1") == (("gpu",), ())


def test_lane_programs_are_listed_by_name() -> None:
    s = settings_from_mapping({"lanes": {"programs": ["a.b:C", "a.b:C", "x:Y"], "nice": 5}})
    assert s.lanes.programs == ("a.b:C", "x:Y") and s.lanes.nice == 5
    assert Settings().lanes.programs == ()


@pytest.mark.parametrize("bad", ["a.b:C", ["shell"], ["os.system"], [3]])
def test_bad_lane_programs_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"\[lanes\] programs"):
        settings_from_mapping({"lanes": {"programs": bad}})


@pytest.mark.parametrize(
    ("section", "struct"),
    [("supervisor", SupervisorSettings), ("shards", ShardSettings), ("lanes", LaneSettings)],
)
def test_an_unknown_key_error_lists_every_key_the_section_takes(section: str, struct: type) -> None:
    """The hint after a typo names every field of the section's settings (the per-shard tables
    included), not only the keys with numeric limits."""
    with pytest.raises(ConfigError) as exc:
        settings_from_mapping({section: {"bogus": 1}})
    hint = str(exc.value)
    for field in msgspec.structs.fields(struct):
        shown = "[shards.shard-N] tables" if field.name == "profiles" else field.name
        assert shown in hint, (field.name, hint)


def test_a_config_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path: Path) -> None:
    """A fifo with no writer, or a symlink to /dev/zero, is refused as not a regular file:
    neither blocks the reader nor is read without bound (a reload runs this in the
    supervisor)."""
    fifo = tmp_path / "tree.toml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(fifo)
    zero = tmp_path / "zero.toml"
    zero.symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(zero)


def test_a_huge_config_or_value_makes_a_short_error(tmp_path: Path) -> None:
    """A file over 1 MiB is refused unread; a bad value or key of any size is shown cut, so
    the error stays one short line."""
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than 1024 KiB"):
        load_settings(big)
    value = tmp_path / "value.toml"
    value.write_text(f'[supervisor]\nspawn = "{"y" * 500_000}"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(value)
    assert len(str(info.value)) < 600 and "\n" not in str(info.value)
    array = tmp_path / "array.toml"
    array.write_text("[supervisor]\nwatchdog_s = [" + "1, " * 200_000 + "]\n")
    with pytest.raises(ConfigError) as info:
        load_settings(array)
    assert len(str(info.value)) < 600
    key = tmp_path / "key.toml"
    key.write_text(f"[supervisor]\n{'k' * 300_000} = 1\n")
    with pytest.raises(ConfigError) as info:
        load_settings(key)
    assert len(str(info.value)) < 600


def test_a_config_nested_past_the_parser_is_one_line(tmp_path: Path) -> None:
    """An array nested 100,000 deep makes the TOML parser recurse out: a one-line refusal,
    not a RecursionError traceback (nor an 'internal error' from a reload)."""
    deep = tmp_path / "deep.toml"
    deep.write_text("[relay]\ndeadline_s = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_settings(deep)


@pytest.mark.parametrize(
    ("text", "near"),
    [
        ("[supervisor]\nwatchdog = 3\n", "unknown key 'watchdog': did you mean 'watchdog_s'?"),
        ("[shards]\nlanes = 4\n", "unknown key 'lanes': did you mean 'lanes_per_shard'?"),
        ("[lanes]\nmax_worker_losses = 2\n", "did you mean 'max_worker_loss'?"),
        (
            "[supervisr]\nmax_restarts = 1\n",
            "unknown section [supervisr]: did you mean [supervisor]?",
        ),
        ('[isolation]\nmode = "bwarp"\n', "\"none\": did you mean 'bwrap'?"),
        ("[shards.shard-0]\ncapability = []\n", "did you mean 'capabilities'?"),
        (
            "[quotas.acme]\nwindow = 60\n",
            "[quotas.acme] unknown key 'window': did you mean 'window_s'?",
        ),
        ("[supervisor]\ncount = 2\n", "unknown key 'count': it belongs in [shards]"),
        ("[shards]\nprograms = []\n", "unknown key 'programs': it belongs in [lanes]"),
        ("[supervisor]\nrate = 2\n", "it belongs in [quotas.<tenant>]"),
    ],
)
def test_a_mistyped_key_is_answered_with_the_near_one(tmp_path: Path, text: str, near: str) -> None:
    """A key one slip away from a real one, or a real key in the wrong section: the refusal
    says what was meant, and still lists what the section takes."""
    message = _refused(tmp_path, text)
    assert near in message
    assert "(known: " in message or "expected one of" in message


def test_lane_user_from_the_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`[isolation] lane_user` is read from the file, replaced by `$ORCHESTRA_SUP_LANE_USER`,
    checked against its choices, and "dynamic" is refused where the tree is not root."""
    path = tmp_path / "c.toml"
    path.write_text('[isolation]\nmode = "none"\nlane_user = "tree"\n')
    assert load_settings(path).isolation.lane_user == "tree"
    monkeypatch.setenv(LANE_USER_ENV, "auto")
    assert load_settings(path).isolation.lane_user == "auto"
    monkeypatch.setenv(LANE_USER_ENV, "nobody")
    with pytest.raises(ConfigError, match='lane_user = "nobody": expected one of "auto"'):
        load_settings(path)
    monkeypatch.setenv(LANE_USER_ENV, "dynamic")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="only root can run lanes as uids of their own"):
        load_settings(path)
