"""Tests for `orchestra_sup.coordinator.plan`: parsing, every refusal, and topological order."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from orchestra_sup.coordinator.plan import (
    MAX_TASKS,
    load_plan,
    parse_plan,
    plan_from_mapping,
    topological_order,
    validate_plan,
)
from orchestra_sup.errors import PlanError
from orchestra_sup.protocol.frames import Budget, PlanSpec, TaskSpec
from tests.unit.test_plan_scaling import lines_run

VALID = """\
name = "selfcheck"

[[task]]
id = "lint"
run = "ruff check ."
timeout_s = 60

[[task]]
id = "test"
run = "pytest -q"
needs = ["lint"]
timeout_s = 2.5
commit = true

[[task]]
id = "docs.build_1-x"
run = "make docs"
"""


def _refused(text: str, source: str = "plan.toml") -> PlanError:
    """Parse `text`, expecting a PlanError; check it is one line and names the source."""
    with pytest.raises(PlanError) as info:
        parse_plan(text, source=source)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{source}: ")
    return info.value


def _plan(*tasks: str, name: str = 'name = "p"') -> str:
    """A plan text from a name line and [[task]] bodies."""
    return name + "\n" + "".join(f"[[task]]\n{body}\n" for body in tasks)


# --- valid plans ----------------------------------------------------------------------------------


def test_valid_plan_round_trips() -> None:
    """A valid plan parses to the expected PlanSpec in file order and survives msgpack encoding."""
    plan = parse_plan(VALID)
    assert plan == PlanSpec(
        name="selfcheck",
        tasks=[
            TaskSpec(id="lint", run="ruff check .", needs=[], timeout_s=60.0, commit=False),
            TaskSpec(id="test", run="pytest -q", needs=["lint"], timeout_s=2.5, commit=True),
            TaskSpec(id="docs.build_1-x", run="make docs"),
        ],
    )
    assert isinstance(plan.tasks[0].timeout_s, float)
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(plan), type=PlanSpec)
    assert decoded == plan


def test_load_plan_reads_file(tmp_path: Path) -> None:
    """load_plan parses the file it is given, the same as parse_plan on its text."""
    path = tmp_path / "plan.toml"
    path.write_text(VALID, encoding="utf-8")
    assert load_plan(path) == parse_plan(VALID)


def test_id_edge_cases_accepted() -> None:
    """Ids of one character and of 64 characters with `_ . -` are accepted."""
    long_id = "A" + "b_.-" * 15 + "xyz"
    assert len(long_id) == 64
    plan = parse_plan(_plan('id = "a"\nrun = "x"', f'id = "{long_id}"\nrun = "x"'))
    assert [t.id for t in plan.tasks] == ["a", long_id]


# --- refusals: file and TOML ----------------------------------------------------------------------


def test_missing_file_names_path(tmp_path: Path) -> None:
    """A missing plan file is a PlanError naming the path."""
    path = tmp_path / "nope.toml"
    with pytest.raises(PlanError) as info:
        load_plan(path)
    assert str(path) in str(info.value)
    assert "No such file" in str(info.value)


def test_unreadable_file_names_path(tmp_path: Path) -> None:
    """A directory or non-UTF-8 file given as the plan is a PlanError naming the path."""
    with pytest.raises(PlanError, match="cannot read plan file") as info:
        load_plan(tmp_path)
    assert str(tmp_path) in str(info.value)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b'name = "\xff"\n')
    with pytest.raises(PlanError, match="not UTF-8") as info:
        load_plan(binary)
    assert str(binary) in str(info.value)


def test_invalid_toml_names_line() -> None:
    """Invalid TOML is refused with the line tomllib points at."""
    err = _refused('name = "p"\n[[task]]\nid = "a"\nrun = \n')
    assert "invalid TOML" in str(err)
    assert "line 4" in str(err)


def test_default_source_label() -> None:
    """Without a source, messages are prefixed with <plan>."""
    with pytest.raises(PlanError, match=r"^<plan>: "):
        parse_plan("oops")


# --- refusals: top level --------------------------------------------------------------------------


def test_unknown_top_level_key() -> None:
    """An unknown top-level key is refused by name."""
    err = _refused(_plan('id = "a"\nrun = "x"', name='name = "p"\nowner = "me"'))
    assert "unknown top-level key 'owner'" in str(err)


def test_missing_name() -> None:
    """A plan without `name` is refused."""
    err = _refused(_plan('id = "a"\nrun = "x"', name=""))
    assert "missing required key 'name'" in str(err)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('name = ""', "key 'name' must not be empty"),
        ('name = "  "', "key 'name' must not be empty"),
        ("name = 3", "key 'name' must be a string, got 3 (integer)"),
    ],
)
def test_bad_name(line: str, expected: str) -> None:
    """An empty or non-string `name` is refused, naming the value."""
    assert expected in str(_refused(_plan('id = "a"\nrun = "x"', name=line)))


@pytest.mark.parametrize("text", ['name = "p"\n', 'name = "p"\ntask = []\n'])
def test_no_tasks(text: str) -> None:
    """A plan without any [[task]] is refused."""
    assert "no tasks" in str(_refused(text))


def test_task_not_an_array_of_tables() -> None:
    """`task` as a single table or an array of non-tables is refused."""
    err = _refused('name = "p"\n[task]\nid = "a"\nrun = "x"\n')
    assert "'task' must be an array of [[task]] tables" in str(err)
    err = _refused('name = "p"\ntask = [1]\n')
    assert "task '#1'" in str(err)
    assert "must be a [[task]] table, got 1 (integer)" in str(err)


# --- refusals: one task ---------------------------------------------------------------------------


def test_unknown_task_key_names_task_and_key() -> None:
    """An unknown key in a task is refused, naming the task and the key."""
    err = _refused(_plan('id = "a"\nrun = "x"\nneeds_all = []'))
    assert err.task == "a"
    assert "task 'a'" in str(err)
    assert "unknown key 'needs_all'" in str(err)


def test_missing_id_names_position() -> None:
    """A task without `id` is refused, named by its position in the file."""
    err = _refused(_plan('id = "a"\nrun = "x"', 'run = "y"'))
    assert err.task == "#2"
    assert "task '#2': missing required key 'id'" in str(err)


def test_missing_run_names_task() -> None:
    """A task without `run` is refused, naming the task."""
    err = _refused(_plan('id = "a"\ncommit = true'))
    assert "task 'a': missing required key 'run'" in str(err)


def test_empty_run() -> None:
    """A blank `run` is refused, naming the task."""
    err = _refused(_plan('id = "a"\nrun = "   "'))
    assert "task 'a': key 'run' must not be empty" in str(err)


@pytest.mark.parametrize(
    "id_value",
    ['"a b"', '"-lead"', '".hidden"', '"caf\u00e9"', '""', '"' + "x" * 65 + '"'],
)
def test_bad_id_pattern(id_value: str) -> None:
    """An id outside [A-Za-z0-9][A-Za-z0-9_.-]{0,63} is refused, naming the value."""
    err = _refused(_plan(f'id = {id_value}\nrun = "x"'))
    assert "key 'id' value" in str(err)
    assert id_value.strip('"')[:20] in str(err)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('id = 7\nrun = "x"', "key 'id' must be a string, got 7 (integer)"),
        ('id = "a"\nrun = ["x"]', "key 'run' must be a string, got ['x'] (array)"),
        ('id = "a"\nrun = "x"\nneeds = "b"', "key 'needs' must be an array of task ids, got 'b'"),
        ('id = "a"\nrun = "x"\nneeds = [1]', "key 'needs' must hold task id strings, got 1"),
        (
            'id = "a"\nrun = "x"\ntimeout_s = "5"',
            "key 'timeout_s' must be a number of seconds, got '5'",
        ),
        (
            'id = "a"\nrun = "x"\ntimeout_s = true',
            "key 'timeout_s' must be a number of seconds, got true (boolean)",
        ),
        (
            'id = "a"\nrun = "x"\ntimeout_s = 0',
            "key 'timeout_s' must be a positive finite number, got 0",
        ),
        ('id = "a"\nrun = "x"\ntimeout_s = -1.5', "must be a positive finite number, got -1.5"),
        ('id = "a"\nrun = "x"\ntimeout_s = inf', "must be a positive finite number, got inf"),
        (
            'id = "a"\nrun = "x"\ncommit = "yes"',
            "key 'commit' must be a boolean, got 'yes' (string)",
        ),
    ],
)
def test_wrong_types_name_key_and_value(body: str, expected: str) -> None:
    """A value of the wrong type or range is refused, naming the key and the value."""
    assert expected in str(_refused(_plan(body)))


# --- refusals: across tasks -----------------------------------------------------------------------


def test_duplicate_id() -> None:
    """Two tasks with one id are refused, naming the id and both positions."""
    err = _refused(_plan('id = "a"\nrun = "x"', 'id = "b"\nrun = "y"', 'id = "a"\nrun = "z"'))
    assert "task 'a': duplicate id" in str(err)
    assert "#3" in str(err) and "#1" in str(err)


def test_missing_dependency() -> None:
    """A dependency on a task not in the plan is refused, naming both."""
    err = _refused(_plan('id = "a"\nrun = "x"', 'id = "b"\nrun = "y"\nneeds = ["a", "zz"]'))
    assert "task 'b': needs unknown task 'zz'" in str(err)


def test_self_dependency() -> None:
    """A task needing itself is refused, naming it."""
    err = _refused(_plan('id = "a"\nrun = "x"\nneeds = ["a"]'))
    assert "task 'a': needs itself" in str(err)


def test_repeated_dependency() -> None:
    """A dependency listed twice in one task is refused."""
    err = _refused(_plan('id = "a"\nrun = "x"', 'id = "b"\nrun = "y"\nneeds = ["a", "a"]'))
    assert "task 'b': key 'needs' lists 'a' twice" in str(err)


def test_cycle_named_in_order() -> None:
    """A three-task cycle is refused, naming its tasks in dependency order."""
    err = _refused(
        _plan(
            'id = "free"\nrun = "x"',
            'id = "a"\nrun = "x"\nneeds = ["b"]',
            'id = "b"\nrun = "x"\nneeds = ["free", "c"]',
            'id = "c"\nrun = "x"\nneeds = ["a"]',
        )
    )
    assert "dependency cycle a -> b -> c -> a" in str(err)
    assert err.task == "a"


def test_cycle_reached_through_a_dependent() -> None:
    """A cycle behind a task that merely depends on it is named without that task."""
    err = _refused(
        _plan(
            'id = "top"\nrun = "x"\nneeds = ["y"]',
            'id = "x"\nrun = "x"\nneeds = ["y"]',
            'id = "y"\nrun = "x"\nneeds = ["x"]',
        )
    )
    assert str(err).endswith("dependency cycle x -> y -> x")


# --- topological order ----------------------------------------------------------------------------


def test_topological_order_is_stable() -> None:
    """Dependencies come first; among ready tasks, file order wins."""
    plan = parse_plan(
        _plan(
            'id = "d"\nrun = "x"\nneeds = ["b", "c"]',
            'id = "c"\nrun = "x"',
            'id = "b"\nrun = "x"\nneeds = ["a"]',
            'id = "a"\nrun = "x"',
            'id = "e"\nrun = "x"',
        )
    )
    assert topological_order(plan) == ["c", "a", "b", "d", "e"]
    independent = parse_plan(_plan('id = "z"\nrun = "x"', 'id = "m"\nrun = "x"'))
    assert topological_order(independent) == ["z", "m"]


def test_topological_order_refuses_hand_built_bad_plans() -> None:
    """topological_order itself refuses a missing dependency or a cycle in a hand-built plan."""
    missing = PlanSpec(name="p", tasks=[TaskSpec(id="a", run="x", needs=["q"])])
    with pytest.raises(PlanError, match="needs unknown task 'q'"):
        topological_order(missing)
    cyclic = PlanSpec(
        name="p",
        tasks=[TaskSpec(id="a", run="x", needs=["b"]), TaskSpec(id="b", run="x", needs=["a"])],
    )
    with pytest.raises(PlanError, match="dependency cycle a -> b -> a"):
        topological_order(cyclic)


def test_validate_plan_accepts_what_parse_plan_gives() -> None:
    """A parsed plan passes the coordinator's re-validation unchanged."""
    from orchestra_sup.coordinator.plan import validate_plan

    spec = parse_plan(
        'name = "p"\n[[task]]\nid = "a"\nrun = "true"\n[[task]]\nid = "b"\nrun = "true"\n'
        'needs = ["a"]\ntimeout_s = 5\ncommit = true\n'
    )
    assert validate_plan(spec) == spec


@pytest.mark.parametrize(
    ("tasks", "needle"),
    [
        ([TaskSpec(id="a", run="true", needs=["ghost"])], "ghost"),
        ([TaskSpec(id="a", run="true", timeout_s=-1.0)], "timeout_s"),
        ([TaskSpec(id="a", run="true"), TaskSpec(id="a", run="x")], "duplicate"),
        ([TaskSpec(id="../x", run="true")], "id"),
        ([TaskSpec(id="a", run="")], "run"),
    ],
)
def test_validate_plan_refuses_what_a_file_could_not_say(
    tasks: list[TaskSpec], needle: str
) -> None:
    """A PlanSpec sent straight to the ctl socket gets the same checks as a plan file."""
    from orchestra_sup.coordinator.plan import validate_plan

    with pytest.raises(PlanError) as info:
        validate_plan(PlanSpec(name="p", tasks=tasks))
    assert needle in str(info.value)


# --- placement keys: tenant, requires ------------------------------------------------------------


def test_tenant_and_requires_are_read() -> None:
    spec = parse_plan(
        _plan(
            'id = "a"\nrun = "x"\nrequires = ["gpu", "py3.11", "gpu"]',
            name='name = "p"\ntenant = "acme"',
        )
    )
    assert spec.tenant == "acme"
    assert spec.tasks[0].requires == ["gpu", "py3.11"]  # a repeat is said once


def test_without_placement_keys_nothing_is_required() -> None:
    spec = parse_plan(_plan('id = "a"\nrun = "x"'))
    assert spec.tenant is None and spec.tasks[0].requires == []


@pytest.mark.parametrize(
    ("name_line", "task_body", "expected"),
    [
        ('name = "p"\ntenant = 3', 'id = "a"\nrun = "x"', "key 'tenant' must be a name"),
        ('name = "p"\ntenant = "a b"', 'id = "a"\nrun = "x"', "key 'tenant' must be a name"),
        ('name = "p"', 'id = "a"\nrun = "x"\nrequires = "gpu"', "key 'requires' must be an array"),
        ('name = "p"', 'id = "a"\nrun = "x"\nrequires = [""]', "key 'requires' must hold names"),
        ('name = "p"', 'id = "a"\nrun = "x"\nrequires = [1]', "key 'requires' must hold names"),
    ],
)
def test_bad_placement_keys(name_line: str, task_body: str, expected: str) -> None:
    assert expected in str(_refused(_plan(task_body, name=name_line)))


def test_placement_keys_survive_validation_of_a_submitted_plan() -> None:
    """`validate_plan` (what the coordinator runs on every submission) keeps them."""
    from orchestra_sup.coordinator.plan import validate_plan

    spec = PlanSpec(name="p", tenant="acme", tasks=[TaskSpec(id="a", run="x", requires=["gpu"])])
    assert validate_plan(spec) == spec
    assert validate_plan(PlanSpec(name="p", tasks=[TaskSpec(id="a", run="x")])).tenant is None


def test_program_key_and_run_optional_for_a_program() -> None:
    spec = parse_plan(_plan('id = "a"\nprogram = "pkg.mod:Lane"'))
    assert spec.tasks[0].program == "pkg.mod:Lane" and spec.tasks[0].run == ""
    assert parse_plan(_plan('id = "a"\nrun = "x"')).tasks[0].program == "shell"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('id = "a"\nprogram = "shell"', "missing required key 'run'"),
        ('id = "a"\nprogram = "os.system"', "key 'program' must be 'shell' or 'module:Class'"),
        ('id = "a"\nrun = "x"\nprogram = 3', "key 'program' must be 'shell' or 'module:Class'"),
    ],
)
def test_bad_program_key(body: str, expected: str) -> None:
    assert expected in str(_refused(_plan(body)))


@pytest.mark.parametrize("name", ["a\x1b[31mred", "tab\there", "nl\nx"])
def test_control_characters_in_the_name_are_refused(name: str) -> None:
    err = _refused(_plan('id = "a"\nrun = "x"', name=f"name = {json.dumps(name)}"))
    assert "must not contain control characters" in str(err)


# --- supervision keys: retries, backoff_s, on_failure, approve, budget, tenant, strategy, replan -


def test_supervision_keys_are_read() -> None:
    spec = parse_plan(
        _plan(
            'id = "a"\nrun = "x"\nretries = 2\nbackoff_s = 0.5\non_failure = "pause"\n'
            'approve = true\nbudget = { wall_s = 60, output_bytes = 1000 }\ntenant = "beta"',
            name='name = "p"\nbudget = { cpu_s = 30 }\nstrategy = "rest_for_one"\n'
            'replan = { timeout = "retry_with_feedback" }',
        )
    )
    (task,) = spec.tasks
    assert (task.retries, task.backoff_s, task.on_failure, task.approve) == (2, 0.5, "pause", True)
    assert task.budget == Budget(wall_s=60.0, output_bytes=1000) and task.tenant == "beta"
    assert spec.budget == Budget(cpu_s=30.0) and spec.strategy == "rest_for_one"
    assert spec.replan == {"timeout": "retry_with_feedback"}
    assert validate_plan(spec) == spec  # a submitted plan round-trips through the same checks


@pytest.mark.parametrize(
    ("top", "task_body", "expected"),
    [
        ("", "retries = -1", "key 'retries' must be an integer from 0 to 100, got -1"),
        ("", "retries = 101", "from 0 to 100"),
        ("", "retries = true", "got true (boolean)"),
        ("", "backoff_s = 0", "key 'backoff_s' must be a number of seconds in (0, 300]"),
        ("", "backoff_s = 301", "in (0, 300]"),
        ("", 'on_failure = "maybe"', "key 'on_failure' must be one of escalate, retry, pause"),
        ("", 'on_failure = "retry"', "on_failure = 'retry' needs retries >= 1"),
        ("", 'approve = "yes"', "key 'approve' must be a boolean"),
        ("", "budget = { wall_s = 0 }", "budget key 'wall_s' must be a positive finite number"),
        ("", "budget = { output_bytes = 1.5 }", "'output_bytes' must be a positive integer"),
        ("", "budget = { disk = 1 }", "unknown key 'disk'"),
        ("", "budget = {}", "is empty"),
        ("", "budget = 60", "must be a table"),
        ("", 'tenant = "a b"', "key 'tenant' must be a name"),
        ('strategy = "one_for_none"', "", "key 'strategy' must be one of one_for_one"),
        ('replan = { bogus = "retry" }', "", "unknown failure class 'bogus'"),
        ('replan = { timeout = "panic" }', "", "maps 'timeout' to 'panic' (string)"),
        ("budget = { cpu_s = nan }", "", "budget key 'cpu_s' must be a positive finite"),
    ],
)
def test_bad_supervision_keys_are_one_line_naming_key_and_value(
    top: str, task_body: str, expected: str
) -> None:
    text = _plan(f'id = "a"\nrun = "x"\n{task_body}', name=f'name = "p"\n{top}')
    with pytest.raises(PlanError) as info:
        parse_plan(text)
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_a_plan_at_the_task_limit_is_taken_and_one_more_task_is_refused() -> None:
    """MAX_TASKS tasks parse; one more is refused in one line naming both counts, from a plan
    file and from a submitted spec alike."""
    tasks = [{"id": f"t{i}", "run": "true"} for i in range(MAX_TASKS)]
    assert len(plan_from_mapping({"name": "p", "task": tasks}).tasks) == MAX_TASKS
    expected = f"{MAX_TASKS + 1:,} tasks: a plan holds at most {MAX_TASKS:,}"
    more = [*tasks, {"id": "extra", "run": "true"}]
    with pytest.raises(PlanError, match=expected) as info:
        plan_from_mapping({"name": "p", "task": more})
    assert "\n" not in str(info.value)
    spec = PlanSpec(
        name="p", tasks=[TaskSpec(id=f"t{i}", run="true") for i in range(MAX_TASKS + 1)]
    )
    with pytest.raises(PlanError, match=expected):
        validate_plan(spec)


def test_a_submitted_plan_over_the_limit_is_refused_before_its_tasks_are_read() -> None:
    """The size comes first: a spec of MAX_TASKS + 1 tasks that are all bad (every one needs
    itself) is refused for its size, not for its first task, in a few lines of Python, not
    one per task (nothing of it is converted)."""
    spec = PlanSpec(
        name="p",
        tasks=[TaskSpec(id=f"t{i}", run="true", needs=[f"t{i}"]) for i in range(MAX_TASKS + 1)],
    )

    def refuse() -> None:
        with pytest.raises(PlanError, match="a plan holds at most"):
            validate_plan(spec)

    assert lines_run(refuse) < MAX_TASKS // 4


@pytest.mark.parametrize(
    ("top", "task_body", "near"),
    [
        ("", 'need = ["b"]', "unknown key 'need': did you mean 'needs'?"),
        ("", "timeout = 5", "unknown key 'timeout': did you mean 'timeout_s'?"),
        ("", "needs_all = []", "unknown key 'needs_all': did you mean 'needs'?"),
        ("", "budget = { wall = 1 }", "unknown key 'wall': did you mean 'wall_s'?"),
        ("", 'on_failure = "pasue"', "got 'pasue' (string): did you mean 'pause'?"),
        ('strategy = "one_for_al"', "", "did you mean 'one_for_all'?"),
        ('replan = { timout = "retry" }', "", "class 'timout': did you mean 'timeout'?"),
        ('replan = { timeout = "rety" }', "", "did you mean 'retry'?"),
        ('tasks = "x"', "", "unknown top-level key 'tasks': did you mean 'task'?"),
    ],
)
def test_a_mistyped_name_is_answered_with_the_near_one(top: str, task_body: str, near: str) -> None:
    """A key or a named value one slip away from a real one: the refusal says which one was
    meant (difflib), and still lists what is allowed."""
    text = _plan(f'id = "a"\nrun = "x"\n{task_body}', name=f'name = "p"\n{top}')
    with pytest.raises(PlanError) as info:
        parse_plan(text)
    assert near in str(info.value)
    assert "\n" not in str(info.value)


def test_a_name_like_no_other_gets_no_suggestion() -> None:
    """Nothing near: no guess is made up, only the list of allowed keys."""
    err = _refused(_plan('id = "a"\nrun = "x"\ncolour = "red"'))
    assert "did you mean" not in str(err) and "(allowed: approve," in str(err)


# --- sandbox keys: rev, feedback -----------------------------------------------------------------


def test_rev_and_feedback_are_read_and_survive_validation() -> None:
    spec = parse_plan(_plan('id = "a"\nrun = "x"\nrev = "HEAD~3"\nfeedback = "use tabs"'))
    assert (spec.tasks[0].rev, spec.tasks[0].feedback) == ("HEAD~3", "use tabs")
    assert validate_plan(spec) == spec
    plain = parse_plan(_plan('id = "a"\nrun = "x"')).tasks[0]
    assert plain.rev is None and plain.feedback is None
    most = f'rev = "{"a" * 256}"\nfeedback = "{"é" * 32768}"'  # 256 characters, 64 KiB
    assert parse_plan(_plan(f'id = "a"\nrun = "x"\n{most}')).tasks[0].rev == "a" * 256


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('rev = ""', "key 'rev' must be 1 to 256 characters, no whitespace, got ''"),
        ('rev = "main two"', "no whitespace, got 'main two'"),
        ('rev = "a\\u0000b"', "key 'rev' must be"),
        ('rev = "a\\tb"', "key 'rev' must be"),
        (f'rev = "{"a" * 257}"', "key 'rev' must be"),
        ("rev = 3", "got 3 (integer)"),
        ("feedback = 3", "key 'feedback' must be a string of at most 64 KiB, got 3"),
        (f'feedback = "{"é" * 32769}"', "key 'feedback' must be a string"),
    ],
)
def test_bad_rev_and_feedback_are_one_line_naming_the_key(body: str, expected: str) -> None:
    assert expected in str(_refused(_plan(f'id = "a"\nrun = "x"\n{body}')))
