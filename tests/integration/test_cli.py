"""The `orchestra-sup` command as a user runs it: real subprocesses, real exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestra_sup.coordinator.plan import load_plan
from tests.integration.harness import Tree, assert_no_leftovers, make_repo, wait_until

pytestmark = pytest.mark.integration


def cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestra_sup", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ('name = "p"\n[[task]]\nid = "a"\nrun = "true"\ncolour = "red"\n', ["'a'", "colour"]),
        (
            'name = "p"\n[[task]]\nid = "a"\nrun = "true"\nneeds = ["b"]\n'
            '[[task]]\nid = "b"\nrun = "true"\nneeds = ["a"]\n',
            ["cycle", "a -> b -> a"],
        ),
        (
            'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n[[task]]\nid = "a"\nrun = "x"\n',
            ["'a'", "duplicate"],
        ),
        ('name = "p"\n[[task]]\nid = "a"\nrun = "true"\nneeds = ["ghost"]\n', ["'a'", "ghost"]),
        (
            'name = "p"\n[[task]]\nid = "a"\nrun = "true"\nneed = ["b"]\n',
            ["'a'", "unknown key 'need': did you mean 'needs'?"],
        ),
    ],
    ids=["unknown-key", "cycle", "duplicate-id", "missing-dependency", "near-key"],
)
def test_bad_plan_is_one_line_exit_2(tmp_path: Path, text: str, needles: list[str]) -> None:
    """`run` refuses a bad plan before anything starts: one line naming the task, exit 2."""
    plan = write(tmp_path / "plan.toml", text)
    proc = cli("run", str(plan), "--state-dir", str(tmp_path / "state"))
    assert_one_line_error(proc, 2, *needles)
    assert not (tmp_path / "state").exists()


def test_workspace_that_is_not_a_directory(tmp_path: Path) -> None:
    """A workspace path that is a file is refused with one line, exit 2."""
    plan = write(tmp_path / "plan.toml", 'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n')
    not_dir = write(tmp_path / "file", "x")
    assert_one_line_error(cli("run", str(plan), "--workspace", str(not_dir)), 2, str(not_dir))
    assert_one_line_error(
        cli("start", "--workspace", str(not_dir), "--run-dir", str(tmp_path / "r")),
        2,
        "not a directory",
    )


def test_workspace_that_is_not_a_git_repository(tmp_path: Path) -> None:
    """A plain directory as workspace is refused (never `git init`-ed behind the user's back)."""
    plan = write(tmp_path / "plan.toml", 'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n')
    plain = tmp_path / "plain"
    plain.mkdir()
    assert_one_line_error(cli("run", str(plan), "--workspace", str(plain)), 2, str(plain))
    assert not (plain / ".git").exists()


def test_bad_config_names_key_and_value(tmp_path: Path) -> None:
    """`start` refuses an unknown config key and a bad value, naming both, exit 2."""
    cfg = write(tmp_path / "c.toml", "[shards]\ncount = 0\n")
    assert_one_line_error(
        cli("start", "--config", str(cfg), "--run-dir", str(tmp_path / "r")), 2, "count", "0"
    )
    cfg = write(tmp_path / "c.toml", "[supervisor]\nmax_restart = 3\n")
    assert_one_line_error(
        cli("start", "--config", str(cfg), "--run-dir", str(tmp_path / "r")),
        2,
        "unknown key 'max_restart': did you mean 'max_restarts'?",
    )


def test_ctl_with_no_tree(tmp_path: Path) -> None:
    """Every ctl command with no tree at the run directory: one line, exit 3."""
    for args in (
        ["status"],
        ["lanes", "--json"],
        ["stop"],
        ["restart", "shard-0"],
        ["approve", "l1", "--grant", "wall_s=60"],
        ["accept-partial", "l1"],
    ):
        proc = cli("ctl", "--run-dir", str(tmp_path / "nothing"), *args)
        assert_one_line_error(proc, 3, "no tree is running")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["approve", "l1", "--grant", "wall_s=0"], ["--grant wall_s=0", "positive"]),
        (["approve", "l1", "--grant", "memory=5"], ["unknown key 'memory'"]),
        (["approve", "l1", "--grant", "cpu_s=ten"], ["cpu_s='ten'"]),
        (["approve", "l1", "--grant", ""], ["KEY=VALUE"]),
        (["approve", "l1", "--retries", "-1"], ["--retries"]),
        (["reject", "l1", "--reason", ""], ["--reason must not be empty"]),
        (["reject", "l1", "--reason", " \n "], ["--reason must not be empty"]),
        (["reject", "l1"], ["Missing option", "--reason"]),
        (["redirect", "l1", "--to", ""], ["--to must not be empty"]),
        (["accept-partial"], ["Missing argument"]),
    ],
    ids=[
        "zero-grant",
        "unknown-grant-key",
        "grant-not-a-number",
        "empty-grant",
        "negative-retries",
        "empty-reason",
        "blank-reason",
        "missing-reason",
        "empty-redirect",
        "missing-lane",
    ],
)
def test_bad_hitl_answers_are_refused_before_anything_is_sent(
    tmp_path: Path, args: list[str], needles: list[str]
) -> None:
    """A bad answer is one line and exit 2 even with no tree to send it to (which would be
    exit 3): it is refused before any connection is made."""
    proc = cli("ctl", "--run-dir", str(tmp_path / "nothing"), *args)
    assert_one_line_error(proc, 2, *needles)


def test_run_json_on_a_default_workspace(tmp_path: Path) -> None:
    """`run --json` with no workspace: the custodian makes a fresh repository in the state
    directory; the JSON has the documented shape; exit 1 because one task failed."""
    plan = write(
        tmp_path / "plan.toml",
        'name = "p"\n[[task]]\nid = "ok"\nrun = "echo hi > hi.txt"\ncommit = true\n'
        '[[task]]\nid = "no"\nrun = "exit 4"\n',
    )
    proc = cli("run", str(plan), "--state-dir", str(tmp_path / "s"), "--json", "--shards", "1")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert set(report) >= {"plan", "id", "ok", "tasks"} and report["ok"] is False
    assert report["state_dir"] == str(tmp_path / "s")
    keys = {
        "id",
        "status",
        "exit_code",
        "attempts",
        "shard",
        "lane",
        "sandbox",
        "duration_s",
        "output_tail",
        "commit",
        "error",
    }
    for t in report["tasks"]:
        assert set(t) >= keys
    by_id = {t["id"]: t for t in report["tasks"]}
    assert by_id["ok"]["status"] == "succeeded" and by_id["ok"]["commit"]
    assert by_id["no"]["exit_code"] == 4
    assert (tmp_path / "s" / "workspace" / "hi.txt").read_text() == "hi\n"
    assert_no_leftovers()


def test_ctl_commands_against_a_running_tree(tree: Tree, tmp_path: Path) -> None:
    """status/submit/plan/lanes/cancel/stop as a user types them, with --json shapes."""
    run_dir = str(tree.run_dir)
    status = json.loads(cli("ctl", "--run-dir", run_dir, "status", "--json").stdout)
    assert set(status["supervisor"]) >= {"pid", "version"}
    assert status["supervisor"]["pid"] == tree.proc.pid
    p50, p99, worst = status["supervisor"]["loop_lag_ms"]
    assert 0 <= p50 <= p99 <= worst
    names = [c["name"] for c in status["children"]]
    assert names == ["custodian", "coordinator", "shard-0", "shard-1"]
    for c in status["children"]:
        assert {"name", "role", "pid", "generation", "state", "restarts"} <= set(c)
        assert c["state"] == "running" and c["generation"] == 1

    plan = write(tmp_path / "p.toml", 'name = "p"\n[[task]]\nid = "slow"\nrun = "sleep 300"\n')
    submitted = cli("ctl", "--run-dir", run_dir, "submit", str(plan), "--json")
    plan_id = json.loads(submitted.stdout)["id"]
    listed = json.loads(cli("ctl", "--run-dir", run_dir, "plans", "--json").stdout)["plans"]
    assert [(p["id"], p["plan"], p["done"]) for p in listed] == [(plan_id, "p", False)]
    table = cli("ctl", "--run-dir", run_dir, "plans").stdout
    assert plan_id in table and "running" in table

    def lanes() -> list[dict[str, object]]:
        out = cli("ctl", "--run-dir", run_dir, "lanes", "--json")
        return [lane for lane in json.loads(out.stdout)["lanes"] if lane["state"] == "running"]

    (lane,) = wait_until(lanes, 20, "the lane to run")  # type: ignore[misc]
    assert set(lane) == {
        "lane",
        "task",
        "plan",
        "shard",
        "state",
        "sandbox",
        "question",
        "since",
    } | {
        "accepts",
        "needs_retries",
    }
    assert lane["question"] is None and lane["since"] is None and lane["accepts"] == []
    assert lane["plan"] == plan_id and lane["task"] == "slow"
    pending = json.loads(cli("ctl", "--run-dir", run_dir, "plan", plan_id, "--json").stdout)
    assert pending["tasks"][0]["status"] == "running"

    assert cli("ctl", "--run-dir", run_dir, "cancel", str(lane["lane"])).returncode == 0
    waited = cli("ctl", "--run-dir", run_dir, "plan", plan_id, "--wait", "--json")
    assert waited.returncode == 1
    assert json.loads(waited.stdout)["tasks"][0]["status"] == "cancelled"

    stopped = cli("ctl", "--run-dir", run_dir, "stop", "--json")
    assert stopped.returncode == 0 and json.loads(stopped.stdout) == {"stopped": True}
    assert tree.proc.poll() is not None or tree.proc.wait(timeout=5) == 0  # it waited for exit
    assert_no_leftovers()


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_interrupted_run_stops_its_tree(tmp_path: Path, how: str) -> None:
    """SIGTERM to `run`, or Ctrl-C (SIGINT to its whole process group), stops the private tree
    and its lanes; nothing is left running."""
    import os
    import signal

    plan = write(
        tmp_path / "p.toml", 'name = "p"\n[[task]]\nid = "s"\nrun = "echo up; sleep 300"\n'
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestra_sup",
            "run",
            str(plan),
            "--state-dir",
            str(tmp_path / "s"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )

    def lane_running() -> bool:
        import psutil

        try:
            kids = psutil.Process(proc.pid).children(recursive=True)
            return any(p.name() == "sleep" for p in kids)
        except (psutil.Error, OSError):  # a process vanished while we walked the tree
            return False

    try:
        wait_until(lane_running, 30, "the lane's command to start")
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "orchestra-sup: interrupted; the tree was stopped"
    assert "Traceback" not in err
    assert_no_leftovers()


def test_plans_the_tree_refuses_are_bad_input(tree: Tree, tmp_path: Path) -> None:
    """A need no shard meets, a program not allowed: one line, exit 2, like any bad plan."""
    run_dir = str(tree.run_dir)
    nowhere = write(
        tmp_path / "n.toml", 'name = "n"\n[[task]]\nid = "x"\nrun = "true"\nrequires = ["gpu"]\n'
    )
    assert_one_line_error(  # named by its file, as a refusal read from the file is
        cli("ctl", "--run-dir", run_dir, "submit", str(nowhere)),
        2,
        f"{nowhere}: task x: no shard offers",
    )
    odd = write(tmp_path / "o.toml", 'name = "o"\n[[task]]\nid = "x"\nprogram = "os:Nope"\n')
    assert_one_line_error(
        cli("ctl", "--run-dir", run_dir, "submit", str(odd)), 2, "is not in [lanes] programs"
    )
    assert_one_line_error(cli("ctl", "--run-dir", run_dir, "restart", "bogus"), 2, "bogus")


def big_plan(path: Path, tasks: int = 100, run_bytes: int = 170_000) -> Path:
    """A valid plan of about 17 MB (`tasks` tasks, each a `run` of `run_bytes`): over the
    16 MiB frame limit once encoded, and nothing wrong with it otherwise."""
    body = "".join(f'[[task]]\nid = "t{i}"\nrun = "echo {"x" * run_bytes}"\n' for i in range(tasks))
    return write(path, 'name = "big"\n' + body)


def test_a_plan_over_the_frame_limit_is_refused_before_it_is_sent(
    tree: Tree, tmp_path: Path
) -> None:
    """Issue 24, defect 4: `ctl submit` of a valid 17 MB plan exits 2 at once in one line
    naming its size and the limit, instead of waiting out --timeout and saying the tree did
    not answer; nothing reached the tree (it counts no bad frame) and it takes the next plan."""
    plan = big_plan(tmp_path / "big.toml")
    assert plan.stat().st_size > 17_000_000
    done = cli("ctl", "--run-dir", str(tree.run_dir), "submit", str(plan), "--timeout", "30")
    assert_one_line_error(done, 2, "16,777,216 bytes (16 MiB)", "largest request the tree takes")
    assert "17,0" in done.stderr  # its own size, in bytes
    assert tree.status().bad_frames == 0
    small = write(tmp_path / "s.toml", 'name = "s"\n[[task]]\nid = "a"\nrun = "true"\n')
    assert tree.wait_plan(tree.submit(load_plan(small))).ok


def test_text_that_looks_like_markup_is_printed_as_itself(tmp_path: Path) -> None:
    """A plan name and output with rich markup in them ("[/oops]") print verbatim; they once
    crashed the table renderer with a MarkupError traceback."""
    plan = write(
        tmp_path / "m.toml",
        'name = "[/oops] [bold]p"\n[[task]]\nid = "a"\nrun = "echo \'[/b]\'; exit 3"\n',
    )
    done = cli("run", str(plan), "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "plan [/oops] [bold]p (" in done.stdout


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    """A missing argument, an unknown command or a bad option value: one line, exit 2."""
    assert_one_line_error(cli("ctl", "restart"), 2, "Missing argument")
    assert_one_line_error(cli("stat"), 2, "No such command")
    assert_one_line_error(cli("run", "x.toml", "--shards", "abc"), 2, "--shards")


def test_ctl_run_dir_after_the_command(tmp_path: Path) -> None:
    """`ctl status --run-dir DIR` works like `ctl --run-dir DIR status`."""
    assert_one_line_error(cli("ctl", "status", "--run-dir", str(tmp_path / "x")), 3, str(tmp_path))


def test_state_dir_problems_are_one_line(tmp_path: Path, repo: Path) -> None:
    """A state directory that is a file, or that lies inside the workspace, is bad input."""
    afile = write(tmp_path / "afile", "x")
    run_dir = str(tmp_path / "r")
    assert_one_line_error(
        cli("start", "--state-dir", str(afile), "--run-dir", run_dir), 2, "not a directory"
    )
    assert_one_line_error(
        cli(
            "start",
            "--workspace",
            str(repo),
            "--state-dir",
            str(repo / "state"),
            "--run-dir",
            run_dir,
        ),
        2,
        "inside the workspace",
    )
    assert not (repo / "state").exists()


PLAN = 'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n'


def injecting(tmp_path: Path) -> Path:
    """A git repository whose path holds a newline and an `ExecStartPre=` after it (`start`
    once ran a tree on it, and every lane failed in `git clone`: git's alternates file is one
    path per line)."""
    return make_repo(tmp_path / f"ws\nExecStartPre=/bin/touch {tmp_path}/pwned")


def assert_refused(proc: subprocess.CompletedProcess[str], where: str) -> None:
    """Status 2, one line naming `where` and showing the value escaped (repr's `\\n`)."""
    assert_one_line_error(proc, 2, f"{where} ", "\\n", ": holds a control character (U+000A")


def files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def test_start_refuses_a_workspace_with_a_newline(tmp_path: Path) -> None:
    """`start --workspace` on that repository: one line, status 2, before the state or the
    run directory is made."""
    workspace = injecting(tmp_path)
    before = files(tmp_path)
    state, run_dir = str(tmp_path / "state"), str(tmp_path / "run")
    proc = cli("start", "--workspace", str(workspace), "--state-dir", state, "--run-dir", run_dir)
    assert_refused(proc, "--workspace")
    assert files(tmp_path) == before


def test_run_refuses_a_workspace_with_a_newline(tmp_path: Path) -> None:
    """`run PLAN --workspace` on that repository, with a state directory or without (then not
    even the temporary one is made): one line, status 2, no task run."""
    workspace = injecting(tmp_path)
    plan = write(tmp_path / "plan.toml", PLAN)
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    before = files(tmp_path)
    assert_refused(cli("run", str(plan), "--workspace", str(workspace), env=env), "--workspace")
    state = str(tmp_path / "state")
    proc = cli("run", str(plan), "--workspace", str(workspace), "--state-dir", state)
    assert_refused(proc, "--workspace")
    assert files(tmp_path) == before


BAD = "x\nExecStartPre=/bin/touch /tmp/pwned"


def test_start_refuses_a_state_dir_that_is_not_utf8(tmp_path: Path) -> None:
    """`start --state-dir` naming a directory whose name is not UTF-8 (it would travel as text
    in the tree's frames): one line naming the byte, status 2, nothing made (on main this was
    a UnicodeEncodeError traceback from the fork template's request)."""
    state = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")
    before = files(tmp_path)
    proc = cli("start", "--state-dir", state, "--run-dir", str(tmp_path / "run"), timeout=60)
    assert_one_line_error(proc, 2, "--state-dir ", "not UTF-8 (0xE9 at index")
    assert files(tmp_path) == before


@pytest.mark.parametrize(
    ("argv", "env", "where"),
    [
        (["start", "--config", "{bad}/c.toml"], {}, "--config"),
        (["start", "--state-dir", "{bad}"], {}, "--state-dir"),
        (["start", "--run-dir", "{bad}"], {}, "--run-dir"),
        (["start", "--ctl-tcp", "tcp://127.0.0.1:0", "--keys", "{bad}"], {}, "--keys"),
        (["start"], {"STATE_DIRECTORY": "{bad}"}, "state directory (from $STATE_DIRECTORY)"),
        (["start"], {"RUNTIME_DIRECTORY": "{bad}"}, "run directory (from $RUNTIME_DIRECTORY)"),
        (["start"], {"XDG_STATE_HOME": "{bad}"}, "state directory (from $XDG_STATE_HOME)"),
        (["run", "{bad}/plan.toml"], {}, "PLAN"),
        (["run", "{ok}/plan.toml", "--config", "{bad}/c.toml"], {}, "--config"),
        (["run", "{ok}/plan.toml", "--state-dir", "{bad}"], {}, "--state-dir"),
        (["run", "{ok}/plan.toml"], {"TMPDIR": "{bad}"}, "temporary directory ($TMPDIR)"),
        (["keys", "init", "--dir", "{bad}/keys"], {}, "--dir"),
        (["keys", "init", "--state-dir", "{bad}"], {}, "--state-dir"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_every_path_start_and_run_take_is_checked(
    tmp_path: Path, argv: list[str], env: dict[str, str], where: str
) -> None:
    """Each path option, argument and variable of `start`, `run` and `keys init` with a newline
    in it (the files it names existing, valid): one line naming it, status 2, nothing made."""
    bad, ok = tmp_path / BAD, tmp_path / "ok"
    for each in (bad, ok):
        each.mkdir(parents=True)
        write(each / "plan.toml", PLAN)
        write(each / "c.toml", "[shards]\ncount = 1\n")
    values = {"bad": str(bad), "ok": str(ok)}
    environ = {k: v for k, v in os.environ.items() if k not in ("ORCHESTRA_SUP_RUN_DIR",)}
    environ |= {"XDG_STATE_HOME": str(ok), "XDG_RUNTIME_DIR": str(ok), "TMPDIR": str(ok)}
    environ |= {k: v.format(**values) for k, v in env.items()}
    if "STATE_DIRECTORY" not in env:
        environ.pop("STATE_DIRECTORY", None)
    before = files(tmp_path)
    proc = cli(*(a.format(**values) for a in argv), env=environ, timeout=60)
    assert_refused(proc, where)
    assert files(tmp_path) == before


def test_run_on_a_live_trees_state_dir_is_refused_untouched(tree: Tree, tmp_path: Path) -> None:
    """`run --state-dir` naming a live tree's state directory: one line, exit 2, before a
    private tree is started (which would write its log into the live tree's directory)."""
    plan = write(tmp_path / "plan.toml", 'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n')
    proc = cli("run", str(plan), "--state-dir", str(tree.state_dir))
    assert_one_line_error(proc, 2, f"state directory {tree.state_dir}", "owned by a live tree")
    assert not (tree.state_dir / "tree.log").exists()
    assert tree.status().supervisor_pid == tree.proc.pid


def test_run_of_a_plan_that_asks_says_where_to_answer(tmp_path: Path) -> None:
    """`run` of a plan with `approve = true` prints the private tree's run directory on stderr
    before it waits; the `ctl --run-dir ... lanes` it names lists the pause, and an approval
    sent there lets the plan finish (a newcomer found only the state directory, which no ctl
    takes)."""
    ws = make_repo(tmp_path / "ws")
    plan = write(tmp_path / "plan.toml", 'name = "gate"\n[[task]]\nid = "d"\nrun = "true"\n')
    plan.write_text(plan.read_text() + "approve = true\n")
    argv = [sys.executable, "-m", "orchestra_sup", "run", str(plan), "--workspace", str(ws)]
    argv += ["--state-dir", str(tmp_path / "state")]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("run: the tree's run directory is /tmp/osup-"), line
        run_dir = line.split("`orchestra-sup ctl --run-dir ", 1)[1].split(" ", 1)[0]
        lanes = wait_until(
            lambda: json.loads(
                cli("ctl", "--run-dir", run_dir, "lanes", "--json").stdout or "{}"
            ).get("lanes"),
            60,
            "the approval to be listed",
        )
        assert isinstance(lanes, list)
        approved = cli("ctl", "--run-dir", run_dir, "approve", lanes[0]["lane"])
        assert approved.returncode == 0, approved.stderr
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
