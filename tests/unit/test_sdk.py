"""The SDK's pure parts (`orchestra_sup.client.sdk`): a tool's parameters as the wire carries
them, a plan checked as ctl checks a file, a grant, a message's size, a wait's deadline, the
endpoint options; and the package's public face importing the clients only when asked."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import orchestra_sup
from orchestra_sup.client import aio, sdk
from orchestra_sup.errors import CallTimeout, ConfigError, PlanError
from orchestra_sup.protocol import frames as f


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (0, "0"),
        (2.5, "2.5"),
        ("make test", "make test"),
        (["gpu", "x86"], "gpu,x86"),
        (("a", 1, True), "a,1,true"),
        ([], ""),
        (Path("src/x.py"), "src/x.py"),
    ],
)
def test_a_value_goes_as_the_wire_string_ctl_would_send(value: object, wire: str) -> None:
    assert sdk.wire_value("k", value) == wire


def test_params_are_ctl_calls_and_none_is_left_out() -> None:
    got = sdk.wire_params({"run": "echo hi", "timeout_s": 30, "requires": ["gpu"], "name": None})
    assert got == {"run": "echo hi", "timeout_s": "30", "requires": "gpu"}
    # as `ctl call list_dir path=...`: a path whose bytes are not UTF-8 goes as path_b64
    assert sdk.wire_params({"path": b"caf\xe9"}) == {"path_b64": "Y2Fm6Q=="}


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"x": {"a": 1}}, "parameter x: a dict cannot be sent"),
        ({"x": [["nested"]]}, "parameter x: a list cannot be sent"),
        ({"x": ["a,b"]}, "a list item holds a comma"),
        ({"a=b": 1}, "parameter name 'a=b'"),
        ({"lane": "l\udcff"}, "is not UTF-8"),
    ],
)
def test_a_param_the_wire_cannot_carry_is_refused(params: dict[str, object], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        sdk.wire_params(params)


def test_a_plan_dict_is_checked_as_a_file_is(tmp_path: Path) -> None:
    toml = 'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n'
    (tmp_path / "p.toml").write_text(toml)
    from_file = sdk.plan_spec(tmp_path / "p.toml")
    assert sdk.plan_spec(str(tmp_path / "p.toml")) == from_file
    assert sdk.plan_spec({"name": "p", "task": [{"id": "a", "run": "true"}]}) == from_file
    assert sdk.plan_spec(from_file) == from_file
    with pytest.raises(PlanError, match=r"unknown top-level key 'tasks'.*did you mean 'task'"):
        sdk.plan_spec({"name": "p", "tasks": []})
    with pytest.raises(PlanError, match="cannot read plan file"):
        sdk.plan_spec(tmp_path / "missing.toml")
    with pytest.raises(PlanError, match="not int"):
        sdk.plan_spec(3)  # type: ignore[arg-type]


def test_a_grant_is_the_text_ctl_approve_takes_or_a_dict_of_it() -> None:
    budget = f.Budget(wall_s=60.0, output_bytes=1000)
    assert sdk.grant_budget({"wall_s": 60, "output_bytes": 1000}) == budget
    assert sdk.grant_budget("wall_s=60,output_bytes=1000") == budget
    assert sdk.grant_budget(None) is None
    with pytest.raises(ConfigError, match="unknown key 'wall'"):
        sdk.grant_budget({"wall": 1})
    with pytest.raises(ConfigError, match="must be positive"):
        sdk.grant_budget({"cpu_s": -1})


def test_a_message_is_at_most_64_kib_of_utf8() -> None:
    fits = "\u00e9" * (f.MESSAGE_MAX_BYTES // 2)  # two bytes each
    assert sdk.message_request("p", fits) == f.CtlMessage(plan="p", text=fits)
    with pytest.raises(ValueError, match=f"65538 bytes of UTF-8, over the {f.MESSAGE_MAX_BYTES}"):
        sdk.message_request("p", fits + "\u00e9")


def test_a_wait_gives_up_at_its_deadline_with_call_timeout() -> None:
    assert sdk.PlanWait("p", None).next_poll_s() == sdk.WAIT_POLL_S
    assert 0 < sdk.PlanWait("p", 1.0).next_poll_s() <= 1.0
    with pytest.raises(CallTimeout, match=r"plan p1 has not ended after 0 s; it runs on"):
        sdk.PlanWait("p1", 0.0).next_poll_s()  # a deadline of now has passed when next asked


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"connect": "ipc:///x"}, "connect ipc:///x: give a tcp://HOST:PORT address"),
        ({"connect": "tcp://h:1"}, "a tcp:// endpoint needs keys"),
        ({"keys": object()}, "keys are for connect"),
        ({"timeout_s": 0.0}, "timeout_s=0.0: give a positive number of seconds"),
        ({"call_timeout_s": float("nan")}, "call_timeout_s=nan: give a positive number"),
    ],
)
def test_the_options_are_checked_as_ctl_checks_them(options: dict[str, Any], words: str) -> None:
    """Before anything connects: the run directory here has no tree, and is not looked at."""
    with pytest.raises(ConfigError, match=words):
        sdk.Client("/nonexistent", **options)
    with pytest.raises(ConfigError, match=words):
        aio.AsyncClient("/nonexistent", **options)


def test_a_long_poll_of_negative_seconds_is_refused_before_anything_connects() -> None:
    with pytest.raises(ConfigError, match=r"wait_s=-1\.0: give 0 or more seconds"):
        sdk.Client("/nonexistent").plan("p", wait_s=-1.0)


def test_the_package_names_the_clients_and_imports_them_only_when_asked() -> None:
    assert orchestra_sup.Client is sdk.Client
    assert orchestra_sup.AsyncClient is aio.AsyncClient
    assert set(orchestra_sup.__all__) == {"Client", "AsyncClient", "__version__"}
    with pytest.raises(AttributeError, match="has no attribute 'Clint'"):
        orchestra_sup.Clint  # noqa: B018
    probe = (
        "import sys, orchestra_sup.errors; "
        "print(sorted(m for m in sys.modules if m.startswith('orchestra_sup.')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert loaded.strip() == "['orchestra_sup.errors']"
