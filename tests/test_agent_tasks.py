"""The built-in environments as tasks by name through every stage, from the command line: train, eval, sample, sft
and the agent recipe; and one path that samples (engines built through the registry only)."""

import json
import re

import pytest
import torch
import yaml

from aha.cli import main
from aha.envs.filesystem import FilesystemEnv
from aha.rollout import ENGINES
from aha.tasks import get_task
from scripted import ScriptedAgentEngine

AGENT_TASKS = ("filesystem", "calculator", "python")


def solve_some(context: str) -> str:
    """A scripted policy of the filesystem task: it solves the `mkdir` and `create` families (one call, then
    "Done.") and answers every other task with "Done." at once."""
    if "<|im_start|>tool" in context:
        return "Done."
    task = context.rpartition("<|im_start|>user")[2]
    call = None
    if m := re.search(r'Make a folder "([^"]+)"', task):
        call = {"name": "mkdir", "arguments": {"path": m.group(1)}}
    elif m := re.search(r'Create "([^"]+)" containing "([^"]+)"', task):
        call = {"name": "write_file", "arguments": {"path": m.group(1), "content": m.group(2)}}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>" if call else "Done."


class SolverEngine(ScriptedAgentEngine):
    def __init__(self, model, tokenizer, max_batch=512):
        super().__init__(model, tokenizer, max_batch, script=solve_some)


SOLVED = ("mkdir", "create")


@pytest.fixture
def solver(monkeypatch):
    """`engine=solver`: the scripted policy above, registered by name as any engine is."""
    monkeypatch.setitem(ENGINES, "solver", f"{__name__}:SolverEngine")
    return "solver"


@pytest.fixture(scope="module")
def agent_tiny(tmp_path_factory):
    """A tiny model built in code, its tokenizer fitted on the agent tasks' demonstrations (aha.stages.tiny_corpus)."""
    from aha.models.tiny import make_tiny
    from aha.stages import tiny_corpus
    texts = tiny_corpus(get_task("filesystem"), 200) + tiny_corpus(get_task("calculator"), 100)
    return str(make_tiny(tmp_path_factory.mktemp("agent") / "model", texts, size="tiny", seed=0))


@pytest.mark.parametrize("name", AGENT_TASKS)
def test_the_built_in_environments_are_tasks_with_splits_and_tools(name):
    task = get_task(name)
    train, test = task.load("train", 50), task.load("test", 20)
    assert task.is_agent and not {r["id"] for r in train} & {r["id"] for r in test}
    agent = task.agent()
    assert agent.schemas[None], "the episodes are shown the task's tools"
    with pytest.raises(ValueError, match="no split 'dev'"):
        task.load("dev")
    assert len(task.demonstrate(test[0])) >= 4  # prompt, a call, its result, the closing reply


def test_the_filesystem_task_succeeds_when_the_tree_matches():
    task, row = get_task("filesystem"), get_task("filesystem").load("test", 1)[0]
    env = FilesystemEnv()
    env.reset(**row)
    verdict = task.correct()
    assert verdict(environments=[env]) == [0.0]          # nothing done yet
    for name, args, _ in row["solution"]:
        getattr(env, name)(**args)
    assert verdict(environments=[env]) == [1.0]          # the solving calls reach the reference tree


def test_the_calculator_task_reads_the_last_reply():
    task, row = get_task("calculator"), get_task("calculator").load("test", 1)[0]
    messages = task.demonstrate(row)[1:]
    assert task.correct()(completions=[messages], answer=[row["answer"]]) == [1.0]
    wrong = messages[:-1] + [{"role": "assistant", "content": "The answer is 7."}]
    assert task.correct()(completions=[wrong], answer=[row["answer"]]) == [0.0]


def test_aha_train_task_filesystem_trains_two_steps_and_logs_tool_metrics(agent_tiny, tmp_path):
    out = tmp_path / "grpo"
    assert main(["train", f"model={agent_tiny}", "task=filesystem", "max_steps=2", "num_generations=2",
                 "per_device_train_batch_size=4", "max_completion_length=24", "learning_rate=1e-2",
                 "eval_steps=2", "eval_samples=2", f"output_dir={out}", "progress_bar=false", "report_to=[jsonl]"]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if "tools/calls_per_episode" in x]
    assert len(steps) == 2 and all("reward/FilesystemEnv/mean" in x for x in steps)
    assert any("eval/accuracy" in x and "eval/tools/calls_per_episode" in x for x in lines)  # held-out episodes
    assert yaml.safe_load((out / "config.yaml").read_text())["max_tool_calling_iterations"] == 3  # the task's


def test_aha_eval_task_filesystem_reports_success_by_family_and_pass_at_k(agent_tiny, tmp_path, solver):
    out = tmp_path / "eval"
    assert main(["eval", agent_tiny, "task=filesystem", f"engine={solver}", "num_problems=24", "n_samples=2",
                 "k=[1,2]", "max_new_tokens=64", f"output_dir={out}", "progress_bar=false"]) == 0
    summary = json.loads((out / "results.json").read_text())["summary"]
    families = [r["family"] for r in get_task("filesystem").load("test")[:24]]
    solved = sum(f in SOLVED for f in families)
    assert 0 < solved < 24
    assert summary["accuracy"] == pytest.approx(solved / 24)
    lo, hi = summary["accuracy_ci95"]
    assert lo < solved / 24 < hi
    for family in set(families):
        assert summary[f"accuracy/{family}"] == (1.0 if family in SOLVED else 0.0)
    assert summary["pass@2"] == pytest.approx(solved / 24)  # the scripted policy is the same in every sample
    assert summary["tools/calls_per_episode"] == pytest.approx(solved / 24)
    record = json.loads((out / "per_problem.jsonl").read_text().splitlines()[0])
    assert record["messages"][-1]["role"] == "assistant"
    assert "mkdir(path" in record["prompt"]  # the prompt the episode was shown, its tools listed


def test_aha_sample_writes_messages_that_aha_sft_trains_on(agent_tiny, tmp_path, solver):
    out = tmp_path / "sample"
    assert main(["sample", agent_tiny, "task=filesystem", f"engine={solver}", "split=test", "num_prompts=24",
                 "n=2", "max_new_tokens=64", f"output_dir={out}", "progress_bar=false"]) == 0
    rows = [json.loads(x) for x in (out / "data.jsonl").read_text().splitlines()]
    assert rows and {r["family"] for r in rows} <= set(SOLVED)        # only the successful episodes
    messages = rows[0]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["tool_calls"][0]["function"]["name"] in ("mkdir", "write_file")
    assert {t["function"]["name"] for t in rows[0]["tools"]} >= {"mkdir", "write_file", "list_dir"}
    sft = tmp_path / "sft"
    assert main(["sft", f"model={agent_tiny}", f"dataset={out / 'data.jsonl'}", "max_steps=2",
                 "per_device_train_batch_size=2", f"output_dir={sft}", "progress_bar=false", "eval_samples=0"]) == 0
    assert (sft / "model").is_dir()


def test_sft_on_a_tool_conversation_trains_only_the_assistant_turns(agent_tiny, tmp_path):
    from aha.config import SFTConfig
    from aha.train.sft import SFTTrainer
    task = get_task("filesystem")
    row = next(r for r in task.load("test") if r["family"] == "copy")
    data = [{"messages": task.demonstrate(row), "tools": task.agent().schemas[None]}]
    trainer = SFTTrainer(model=agent_tiny, args=SFTConfig(output_dir=str(tmp_path), max_steps=1, progress_bar=False),
                         train_dataset=data)
    prompt, completion, mask = trainer.examples[0]
    tok = trainer.tokenizer
    trained = tok.decode([t for t, m in zip(completion, mask) if m])
    read = tok.decode([t for t, m in zip(completion, mask) if not m])
    text = row["fs"]["start"]["files"][row["solution"][0][1]["path"]]  # what read_file returned
    assert '"name": "read_file"' in trained and '"name": "write_file"' in trained and trained.endswith("Done.<|im_end|>")
    assert "<tool_response>" in read and text in read and "<tool_response>" not in trained
    assert "You can call these tools" in tok.decode(prompt)  # rendered with the schemas, as an episode's prompt
    as_text = SFTTrainer(model=agent_tiny, args=SFTConfig(output_dir=str(tmp_path / "t"), max_steps=1,
                                                          progress_bar=False),
                         train_dataset=[{**data[0], "tools": json.dumps(data[0]["tools"])}])
    assert as_text.examples[0] == trainer.examples[0]  # the schemas as JSON text, as some datasets store them



SMOKE = {"sft": {"max_steps": 1, "per_device_train_batch_size": 2},
         "grpo": {"max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 2, "max_completion_length": 24},
         "sample": {"num_prompts": 24, "n": 2, "max_new_tokens": 64}}
"""Smoke settings put over each stage type's of the example recipe."""


def test_the_agent_recipe_runs_end_to_end_with_smoke_settings(agent_tiny, tmp_path, solver):
    """The shipped recipe as it is, each stage shortened; its sampling stage draws from the scripted policy, so the
    SFT on rejection-sampled episodes has episodes to learn from."""
    from importlib.resources import files

    from aha.recipe import run_recipe
    recipe = yaml.safe_load(files("aha.examples").joinpath("recipe_agent_filesystem.yaml").read_text())
    assert [s["type"] for s in recipe["stages"]] == ["sft", "grpo", "sample", "sft", "grpo"]
    for stage in recipe["stages"]:
        stage.update(SMOKE[stage["type"]], **({"engine": solver} if stage["type"] == "sample" else {}))
    recipe.update(model=agent_tiny, output_dir=str(tmp_path / "recipe"),
                  eval={**recipe["eval"], "num_problems": 6, "max_new_tokens": 24})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    summary = run_recipe(str(path))
    assert [r["stage"] for r in summary["stages"]] == ["cold_start", "grpo1", "rejection_sampling", "rs_sft", "grpo2"]
    assert all("accuracy_ci95" in r["eval"] for r in summary["stages"] if r["type"] != "sample")
    assert summary["stages"][2]["result"]["rows_kept"] > 0


def test_the_documented_environment_of_ones_own_registers_as_a_task(tmp_path, monkeypatch):
    """docs/agents.md's "your own environment as a task" file, as written there: importing it registers a task that
    every stage resolves by name."""
    import importlib
    from pathlib import Path

    import aha.tasks
    import aha.tasks.base
    page = (Path(__file__).parents[1] / "docs" / "agents.md").read_text()
    section = page.split("### Your own environment as a task", 1)[1]
    code = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    (tmp_path / "counter_task.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = dict(aha.tasks.TASKS)  # the task registers in a copy, gone after the test
    monkeypatch.setattr(aha.tasks.base, "TASKS", registry)
    monkeypatch.setattr(aha.tasks, "TASKS", registry)
    module = importlib.import_module("counter_task")
    task = get_task("counter")
    train, test = task.load("train"), task.load("test")
    assert task.is_agent and train and test and not {r["id"] for r in train} & {r["id"] for r in test}
    assert [s["function"]["name"] for s in task.agent().schemas[None]] == ["increment"]
    env = module.CounterEnv()
    env.reset(**test[0])
    while env.count < env.target:
        env.increment(min(3, env.target - env.count))
    assert task.correct()(environments=[env]) == [1.0]


@pytest.mark.parametrize("messages, roles", [
    ([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "mkdir",
                                                                                                "arguments": {}}}]},
      {"role": "tool", "name": "mkdir", "content": "ok"}, {"role": "assistant", "content": "Done."}],
     "'assistant', 'tool', 'assistant'"),                                                  # no prompt
    ([{"role": "user", "content": "Make a folder."}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "mkdir", "arguments": {"path": "a"}}}]},
      {"role": "tool", "name": "mkdir", "content": "ok"}], "'user', 'assistant', 'tool'"),  # ends on a tool result
])
def test_a_tool_conversation_sft_cannot_learn_from_is_an_error_naming_its_row(agent_tiny, tmp_path, messages, roles):
    from aha.config import SFTConfig
    from aha.train.sft import SFTTrainer
    with pytest.raises(ValueError, match=rf"SFT row 0: a tool conversation needs .*\[{roles}\]"):
        SFTTrainer(model=agent_tiny, args=SFTConfig(output_dir=str(tmp_path), max_steps=1, progress_bar=False),
                   train_dataset=[{"messages": messages}])


def test_sft_on_an_agent_task_without_demonstrations_says_what_to_give(monkeypatch):
    import dataclasses

    import aha.stages
    bare = dataclasses.replace(get_task("python"), demonstrate=None)
    with pytest.raises(ValueError, match="task 'python' has no demonstrations to learn from; give SFT a `dataset`"):
        aha.stages.demonstrations(bare)


def test_an_unknown_engine_for_eval_names_the_valid_ones(capsys):
    assert main(["eval", "m", "task=filesystem", "engine=vllm"]) == 2  # a config error, before anything loads
    assert "unknown engine 'vllm'; valid: ['hf']" in capsys.readouterr().err


class RecordingSolver(SolverEngine):
    seen: list = []

    def generate(self, prompt_ids, n, params, generator=None):
        RecordingSolver.seen.append((params.temperature, params.top_p))
        return super().generate(prompt_ids, n, params, generator)


def test_eval_samples_agent_episodes_at_the_temperature_and_top_p_asked(agent_tiny, monkeypatch):
    from aha.eval import evaluate
    monkeypatch.setitem(ENGINES, "recording", f"{__name__}:RecordingSolver")
    monkeypatch.setattr(RecordingSolver, "seen", [])
    from aha.models import load_model, load_tokenizer
    rows = get_task("filesystem").load("test", 4)
    evaluate(load_model(agent_tiny), load_tokenizer(agent_tiny), get_task("filesystem"), rows, k=[2], n_samples=2,
             temperature=0.9, top_p=0.5, max_new_tokens=64, engine="recording")
    assert set(RecordingSolver.seen) == {(0.0, 1.0), (0.9, 0.5)}  # greedy episodes, then the sampled ones


class ContextSolver(SolverEngine):
    """The scripted solver, keeping every context it was given."""
    contexts: list = []

    def generate(self, prompt_ids, n, params, generator=None, **kw):
        ContextSolver.contexts += [self.tok.decode(p) for p in prompt_ids]
        return super().generate(prompt_ids, n, params, generator, **kw)


def test_eval_without_tools_shows_no_tool_and_runs_no_call(agent_tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(ENGINES, "context", f"{__name__}:ContextSolver")
    monkeypatch.setattr(ContextSolver, "contexts", [])
    out = tmp_path / "eval"
    assert main(["eval", agent_tiny, "task=filesystem", "engine=context", "num_problems=24", "tools=false",
                 "max_new_tokens=64", f"output_dir={out}", "progress_bar=false"]) == 0
    summary = json.loads((out / "results.json").read_text())["summary"]
    assert summary["tools"] is False and summary["accuracy"] == 0.0  # the solver's calls are written, never run
    assert summary["tools/calls_per_episode"] == 0.0
    assert ContextSolver.contexts and not any("mkdir(path" in c for c in ContextSolver.contexts)
    assert all("<|im_start|>tool" not in c for c in ContextSolver.contexts)  # one reply: no tool turn
    assert "mkdir(path" not in json.loads((out / "per_problem.jsonl").read_text().splitlines()[0])["prompt"]
    ContextSolver.contexts = []
    assert main(["eval", agent_tiny, "task=filesystem", "engine=context", "num_problems=24",
                 "max_new_tokens=64", f"output_dir={tmp_path / 'with'}", "progress_bar=false"]) == 0
    assert all("mkdir(path" in c for c in ContextSolver.contexts)  # with its tools, every prompt lists them
    assert main(["eval", agent_tiny, "task=arithmetic", "tools=false", "num_problems=2", "progress_bar=false"]) != 0
    assert "tools=false: task 'arithmetic' is not an agent task" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["filesystem", "calculator", "filesystem_grpo_kl"])
def test_the_smollm2_agent_recipes_are_valid(name):
    """benchmarks/smollm2_agent's recipes (BENCHMARKS' real-model table) parse and validate as they ship."""
    from pathlib import Path

    from aha.config.parse import load_yaml
    from aha.recipe import validate
    path = Path(__file__).parents[1] / "benchmarks" / "smollm2_agent" / f"{name}.yaml"
    recipe, numbers = load_yaml(path.read_text(), str(path))
    if recipe["model"].startswith("runs/"):  # a model another recipe makes: checked for existence by validate
        assert recipe["model"] == "runs/smollm2_agent/filesystem/cold_start/model"
        recipe["model"] = "smollm2-135m-instruct"
    stages = validate(recipe, numbers, str(path))
    task = name.split("_")[0]
    assert all(s["task"] == task for s in stages if "task" in s)
    if name == task:  # the whole recipe, from the base with and without tools
        assert [s["type"] for s in stages] == ["eval", "eval", "sft", "grpo", "sample", "sft", "grpo"]
        assert stages[0]["tools"] is False
