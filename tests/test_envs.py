"""The built-in environments: a virtual filesystem, a calculator, run_python; each a task split by hash."""

import pytest

from aha.envs import Agent
from aha.envs.calculator import TOOLS, divide, final_answer, final_number, make_tasks as calc_tasks, multiply
from aha.envs.filesystem import FAMILIES, FilesystemEnv, make_tasks as fs_tasks
from aha.envs.python import make_tasks as python_tasks, run_python


def _env(files=None, dirs=None):
    env = FilesystemEnv()
    env.reset(fs={"instruction": "", "start": {"files": files or {}, "dirs": dirs or []},
                  "goal": {"files": {}, "dirs": []}})
    return env


def test_the_filesystem_tools_do_what_their_docstrings_say():
    env = _env({"notes/a.txt": "x", "notes/b.md": "y"}, ["archive"])
    assert env.list_dir("notes") == "notes/a.txt\nnotes/b.md" and env.list_dir("") == "archive/\nnotes/"
    assert env.move("notes/a.txt", "archive") == "ok" and env.tree.files["archive/a.txt"] == "x"
    env.move("archive/a.txt", "archive/c.txt")
    assert env.read_file("./archive//c.txt") == "x"
    env.mkdir("deep/er")
    env.write_file("deep/er/t.md", "hello")
    env.move("deep", "archive")
    assert env.tree.files["archive/deep/er/t.md"] == "hello" and "deep" not in env.tree.dirs
    env.delete("archive")
    assert env.list_dir("") == "notes/" and env.tree.files == {"notes/b.md": "y"}
    assert env.list_dir("../..") == "notes/"  # ".." stops at the top
    for bad, call in [(FileNotFoundError, lambda: env.read_file("nope")), (FileNotFoundError, lambda: env.list_dir("x")),
                      (FileNotFoundError, lambda: env.write_file("no/dir.txt", "z")),
                      (FileExistsError, lambda: env.move("notes/b.md", "notes/b.md")),
                      (FileNotFoundError, lambda: env.read_file("../../notes/../../etc/passwd"))]:
        with pytest.raises(bad):
            call()


def test_every_task_is_solved_by_its_solution_and_not_by_doing_nothing():
    rows = fs_tasks("train", 300, seed=1)
    assert {r["family"] for r in rows} == set(FAMILIES)
    for row in rows:
        env = FilesystemEnv()
        assert env.reset(**row) is None and env.get_reward() == 0.0  # the goal differs from the start
        for name, args, result in row["solution"]:
            assert getattr(env, name)(**args) == result
        assert env.get_reward() == 1.0
    assert FilesystemEnv().reset().startswith(("Move", "Delete", "Create", "Rename", "Copy", "Make"))  # self-sampling


def test_filesystem_progress_is_the_jaccard_index_of_the_changes_needed_and_made():
    start = {"files": {"tmp/a.log": "x", "tmp/b.log": "y", "tmp/c.txt": "z"}, "dirs": []}
    env = FilesystemEnv()
    env.reset(fs={"instruction": "", "start": start, "goal": {"files": {"tmp/c.txt": "z"}, "dirs": ["tmp"]}})
    assert env.progress() == 0.0                          # need {a.log, b.log}, made nothing
    env.delete("tmp/a.log")
    assert env.progress() == 0.5                          # 1 of the 2 needed, nothing else
    env.delete("tmp/c.txt")
    assert env.progress() == pytest.approx(1 / 3)         # made {a.log, c.txt}: 1 shared of 3 in all
    env.write_file("tmp/c.txt", "z")
    env.delete("tmp/b.log")
    assert env.progress() == 1.0 and env.get_reward() == 1.0
    env.mkdir("new")
    assert env.progress() == pytest.approx(2 / 3) and env.get_reward() == 0.0   # an extra folder counts against
    for row in fs_tasks("train", 60, seed=2):             # on every family: 0 at the start, 1 when solved
        env.reset(**row)
        assert env.progress() == 0.0
        for name, args, _ in row["solution"]:
            getattr(env, name)(**args)
        assert env.progress() == 1.0
    tools = [s["function"]["name"] for s in Agent(environment_factory=FilesystemEnv).schemas[None]]
    assert tools == ["delete", "list_dir", "mkdir", "move", "read_file", "write_file"]   # progress is no tool


def test_splits_are_disjoint_by_hash_and_the_same_on_every_call():
    for make in (fs_tasks, calc_tasks, python_tasks):
        train, test = make("train", 200, 0), make("test", 30, 0)
        assert not {r["id"] for r in train} & {r["id"] for r in test}
        assert make("test", 30, 0) == test


def test_a_failed_filesystem_call_reaches_the_model_as_a_tool_message():
    from aha.data.toolcalls import ToolCall
    agent = Agent(environment_factory=FilesystemEnv)
    (env,) = agent.environments([None])
    row = fs_tasks("test", 1, 0)[0]
    agent.reset(env, row)
    result = agent.toolbox(env, None).call(ToolCall("read_file", {"path": "missing.txt"}))
    assert result.outcome == "raised" and "no file missing.txt" in result.content


def test_the_calculator_is_exact_and_reads_the_final_number():
    assert multiply(4821, 37) == 178377 and isinstance(multiply(2.0, 3), int) and divide(7, 2) == 3.5
    assert final_number("so 1,234 * 2 = 2,468.") == "2468" and final_number("none") is None
    row = calc_tasks("test", 1, 0)[0]
    reply = [{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": row["answer"]},
             {"role": "assistant", "content": f"The answer is {row['answer']}."}]
    assert final_answer([reply, reply[:2] + [{"role": "assistant", "content": "1"}]], [row["answer"]] * 2) == [1.0, 0.0]
    assert [t.__name__ for t in TOOLS] == ["add", "subtract", "multiply", "divide"]


def test_run_python_prints_in_the_sandbox_and_reports_errors():
    assert run_python("print(sum(range(10)))") == "45\n"
    assert "ZeroDivisionError" in run_python("1/0")
    assert "Error" in run_python("import socket; socket.socket()")  # no network
    row = python_tasks("train", 1, 0)[0]
    assert row["answer"].isdigit()


def test_filesystem_calls_that_would_break_the_tree_are_refused_and_change_nothing():
    from aha.envs.filesystem import MAX_DEPTH, MAX_ENTRIES, MAX_PATH_CHARS, MAX_TEXT_CHARS
    env = _env({"a/b/f.txt": "x", "x/g.txt": "y", "notes/a.txt": "z"})
    before = env.tree.state()
    deep = "/".join(["d"] * 20_000)  # 40 KB: every parent a folder would have held ~400 MB of prefixes
    for call, error, says in [
            (lambda: env.move("a", "a/b"), OSError, "cannot move a into itself (a/b/a)"),
            (lambda: env.move("x", "x"), OSError, "cannot move x into itself (x/x)"),
            (lambda: env.move("a", "a/b/c"), OSError, "cannot move a into itself"),
            (lambda: env.mkdir("notes/a.txt/sub"), NotADirectoryError, "notes/a.txt is a file"),
            (lambda: env.mkdir(deep), ValueError, f"path of 20000 parts: at most {MAX_DEPTH}"),
            (lambda: env.mkdir("d/" * 40), ValueError, f"path of 40 parts: at most {MAX_DEPTH}"),
            (lambda: env.write_file("x" * (MAX_PATH_CHARS + 1), "t"), ValueError, "characters: at most"),
            (lambda: env.write_file("big.txt", "t" * MAX_TEXT_CHARS), OSError, f"would pass {MAX_TEXT_CHARS}")]:
        with pytest.raises(error, match=says.replace("(", r"\(").replace(")", r"\)")):
            call()
        assert env.tree.state() == before
    assert env.list_dir("a") == "a/b/" and env.list_dir("a/b") == "a/b/f.txt"
    env.mkdir("/".join(["m"] * MAX_DEPTH))  # at the limit, allowed; moving it one level down is not
    with pytest.raises(ValueError, match=f"parts: at most {MAX_DEPTH}"):
        env.move("m", "x")
    assert env.tree.files == dict(before[0]) and "x/m" not in env.tree.dirs
    env.tree.dirs.update(f"e{i}" for i in range(MAX_ENTRIES - len(env.tree.dirs) - len(env.tree.files)))
    with pytest.raises(OSError, match=f"at most {MAX_ENTRIES}"):
        env.write_file("one_more.txt", "t")


def test_filesystem_families_take_turns_and_a_used_up_family_is_named():
    rows = fs_tasks("train", 60, seed=2)
    assert [r["family"] for r in rows[:12]] == list(FAMILIES) * 2
    assert len({r["id"] for r in rows}) == 60
    with pytest.raises(ValueError, match="family mkdir ran out of distinct test tasks"):
        fs_tasks("test", 2000, seed=0, families=("mkdir",))


def test_a_self_sampling_filesystem_reset_draws_every_family():
    import random
    random.seed(0)
    openings = {FilesystemEnv().reset().split()[0] for _ in range(40)}
    assert openings == {"Move", "Delete", "Create", "Rename", "Copy", "Make"}


def test_final_answer_compares_large_integers_exactly():
    # F(79) = 14472334024676221: as floats it equals F(79) - 1 (both round to 14472334024676220 past 2**53)
    big = "14472334024676221"
    assert final_answer([f"so it is {big}", "so it is 14472334024676220"], [big, big]) == [1.0, 0.0]
    assert final_answer(["x = 2.50"], ["2.5"]) == [1.0]  # equal decimals written differently still match
