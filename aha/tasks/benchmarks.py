"""Benchmarks from offline copies (GSM8K, MATH-500, HumanEval), and any JSONL file as a task.

The files live in `shared/data/` beside the project root, or under $AHA_DATA_DIR (see its README).
Every row keeps an `id` so per-problem results line up across evaluations, and the gold answer in
`answer`: a gold that cannot be parsed is an error in the data, raised at load, never a free reward.
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
from pathlib import Path

from ..data import is_conversational, read_jsonl
from ..data.prompts import TEMPLATES, PromptTemplate, get_template
from .base import Task, check_split, extract_math_answer, register_task

DATA_ENV = "AHA_DATA_DIR"
FORMAT_WEIGHT = 0.1
"""Weight of the format reward next to correctness (1.0) for templates that ask for tags."""


def data_dir() -> Path:
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[3] / "shared" / "data"


def data_path(*parts: str) -> Path:
    """A benchmark file under data_dir(); missing -> FileNotFoundError naming the path and $AHA_DATA_DIR."""
    path = data_dir().joinpath(*parts)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file not found: {path} (set ${DATA_ENV} to the folder "
                                f"holding gsm8k/, math500/ and humaneval/)")
    return path


def subset(rows: list[dict], n: int | None, seed: int) -> list[dict]:
    """All rows (n=None), or n of them drawn with the seed and kept in file order."""
    if n is None or n == len(rows):
        return rows
    if not 0 < n <= len(rows):
        raise ValueError(f"asked for {n} rows; this split has {len(rows)}")
    keep = sorted(random.Random(seed).sample(range(len(rows)), n))
    return [rows[i] for i in keep]


# ---- rewards (imported lazily: importing a task module stays cheap) ----

def _math_correct(strict: bool):
    """The correctness verifier: `strict` reads only an explicit answer (no last-number fallback)."""
    from ..rewards import MathReward, math_reward
    return MathReward(last_number_fallback=False) if strict else math_reward


def _math_rewards(template: PromptTemplate, strict: bool):
    """Correctness, plus the format reward when the template asks for <think>/<answer> tags."""
    from ..rewards import format_reward
    correct = _math_correct(strict)
    return [correct, format_reward] if template.style == "r1" else [correct]


def _weights(template: PromptTemplate) -> list[float]:
    return [1.0, FORMAT_WEIGHT] if template.style == "r1" else [1.0]


def code_preamble(code_prompt: str, entry_point: str) -> str:
    """What a HumanEval-style prompt defines before the function asked for (imports, helpers such as
    HumanEval/32's `poly`): the text up to the last top-level `def <entry_point>(`; "" when there is none.

    >>> code_preamble("import math\\ndef poly(x):\\n    return x\\ndef find_zero(xs):\\n", "find_zero")
    'import math\\ndef poly(x):\\n    return x\\n'
    """
    stubs = list(re.finditer(rf"^(?:async[ \t]+)?def[ \t]+{re.escape(entry_point)}[ \t]*\(", code_prompt, re.M))
    return code_prompt[:stubs[-1].start()] if stubs else ""


def _is_stub(node: ast.stmt) -> bool:
    """A function left for the model to write: its body is only a docstring, `pass`, `...` or a raise."""
    return isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and all(
        isinstance(b, (ast.Pass, ast.Raise)) or isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
        for b in node.body)


def code_helpers(code_prompt: str, entry_point: str) -> str:
    """The prompt's preamble (`code_preamble`) without stubs, as code the tests may trust: HumanEval/32's tests
    call `poly` and /38's `encode_cyclic`, which must be the prompt's, not a program's own (one that returns 0
    would pass them). "" when there is none, or it does not parse."""
    try:
        tree = ast.parse(code_preamble(code_prompt, entry_point))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ""
    return "\n\n".join(ast.unparse(n) for n in tree.body if not _is_stub(n))


def _column(columns: dict, name: str, index: int):
    """Row `index`'s value of column `name` in a reward call's keyword columns; None when the column is absent."""
    values = columns.get(name)
    return values[index] if values else None


def _code_reward(mode: str = "all"):
    """CodeReward that runs each program as HumanEval's own harness does, prompt and completion together: a
    body-only program is completed with the row's `code_prompt` (imports, helpers, signature and docstring); a
    program that defines the entry point itself gets the prompt's imports and helpers in front (its own
    definitions come later and win). The tests themselves see the prompt's helpers, not the program's.
    CodeReward alone does this only for plain-string prompts."""
    from ..rewards import CodeReward, completion_text, extract_program

    class CodePromptReward(CodeReward):
        def program(self, index, prompt, completion, entry, columns):
            head = _column(columns, "code_prompt", index)
            program = extract_program(completion_text(completion))
            if not (head and entry and program.strip()):
                return super().program(index, prompt, completion, entry, columns)
            if f"def {entry}" not in program:
                return head + program  # the body of the function the prompt ends with
            preamble = code_preamble(head, entry)
            return f"{preamble.rstrip()}\n\n\n{program}" if preamble.strip() else program

        def dataset_setup(self, index, entry, columns):
            head = _column(columns, "code_prompt", index)
            helpers = code_helpers(head, entry) if isinstance(head, str) and entry else ""
            return [helpers] if helpers else []

    return CodePromptReward(mode=mode)


# ---- GSM8K ----

GSM8K_ANSWER = re.compile(r"####\s*(.+?)\s*$")
CALCULATOR = re.compile(r"<<[^<>]*>>")


def gsm8k_gold(solution: str) -> str:
    """The number after `#### `, commas stripped. Example: '...\\n#### 1,200' -> '1200'."""
    m = GSM8K_ANSWER.search(solution)
    if not m:
        raise ValueError(f"GSM8K solution has no '#### answer' line: {solution[-80:]!r}")
    return m.group(1).replace(",", "")


def gsm8k_reasoning(solution: str) -> str:
    """The worked steps without the `<<48/2=24>>` calculator notes and the `####` line."""
    return CALCULATOR.sub("", solution[:solution.rfind("####")]).strip()


def gsm8k_rows(split: str, n: int | None = None, seed: int = 0, template="r1") -> list[dict]:
    """Columns: prompt, question, answer (gold number), solution (the reference text, ends with
    `#### n`), completion (the solution in the template's style, for SFT), id (`split/index`)."""
    check_split("gsm8k", split, ("train", "test"))
    tpl = get_template(template)
    path = data_path("gsm8k", f"{split}.jsonl")
    rows = []
    for i, r in enumerate(read_jsonl(path)):
        try:
            gold = gsm8k_gold(r["answer"])
        except ValueError as e:
            raise ValueError(f"{path}: row {i}: {e}") from None
        rows.append({"prompt": tpl(r["question"]), "question": r["question"], "answer": gold,
                     "solution": r["answer"], "completion": tpl.answer(gsm8k_reasoning(r["answer"]), gold),
                     "id": f"{split}/{i}"})
    return subset(rows, n, seed)


def gsm8k_shots(k: int, seed: int = 0, template="r1") -> list[tuple[str, str]]:
    """k worked train problems in the template's answer style, for `get_template(..., shots=...)`."""
    return [(r["question"], r["completion"]) for r in gsm8k_rows("train", k, seed, template)]


def gsm8k_task(template="r1", name: str = "gsm8k") -> Task:
    tpl = get_template(template)
    return Task(
        name=name, load=lambda split, n=None, seed=0: gsm8k_rows(split, n, seed, tpl),
        rewards=lambda: _math_rewards(tpl, strict=False), correct=lambda: _math_correct(False),
        extract=extract_math_answer, reward_weights=_weights(tpl), max_completion_length=512,
        asks_format=tpl.style == "r1",
        description="grade-school maths word problems; gold is the number after ####")


# ---- MATH-500 ----

def math500_rows(split: str = "test", n: int | None = None, seed: int = 0, template="r1") -> list[dict]:
    """Columns: prompt, problem, answer (LaTeX gold), difficulty, subject, id (unique_id)."""
    check_split("math500", split, ("test",))
    tpl = get_template(template)
    path = data_path("math500", "test.json")
    rows = []
    for i, r in enumerate(json.loads(path.read_text())):
        if not str(r.get("answer", "")).strip():
            raise ValueError(f"{path}: row {i} ({r.get('unique_id')}) has an empty gold answer")
        rows.append({"prompt": tpl(r["problem"]), "problem": r["problem"], "answer": r["answer"],
                     "difficulty": r["difficulty"], "subject": r["unique_id"].split("/")[1],
                     "id": r["unique_id"]})
    return subset(rows, n, seed)


def math500_task(template="r1", name: str = "math500") -> Task:
    """Answers are read strictly (`<answer>`, `\\boxed{}`, `#### n`) when the template asks for a format; the
    plain templates ask for none, so there the final number counts, as in jsonl_task (see JSONL_REWARDS)."""
    tpl = get_template(template)
    strict = tpl.style != "plain"
    return Task(
        name=name, load=lambda split, n=None, seed=0: math500_rows(split, n, seed, tpl),
        rewards=lambda: _math_rewards(tpl, strict=strict), correct=lambda: _math_correct(strict),
        extract=extract_math_answer, reward_weights=_weights(tpl), max_completion_length=1024, splits=("test",),
        asks_format=tpl.style == "r1",
        description="MATH-500 competition problems; LaTeX gold compared symbolically")


# ---- HumanEval ----

HUMANEVAL_INSTRUCTION = ("Complete the following Python function. Reply with the whole function "
                         "in one ```python code block.")


def humaneval_question(code: str) -> str:
    return f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{code.rstrip()}\n```"


def humaneval_rows(split: str = "test", n: int | None = None, seed: int = 0, template="plain") -> list[dict]:
    """Columns: prompt, code_prompt (signature + docstring), tests (defines check(candidate)),
    entry_point, solution (canonical body), id (task_id)."""
    check_split("humaneval", split, ("test",))
    tpl = get_template(template)
    rows = [{"prompt": tpl(humaneval_question(r["prompt"])), "code_prompt": r["prompt"], "tests": r["test"],
             "entry_point": r["entry_point"], "solution": r["canonical_solution"], "id": r["task_id"]}
            for r in read_jsonl(data_path("humaneval", "HumanEval.jsonl"))]
    return subset(rows, n, seed)


def humaneval_task(template="plain", name: str = "humaneval") -> Task:
    tpl = get_template(template)
    return Task(
        name=name, load=lambda split, n=None, seed=0: humaneval_rows(split, n, seed, tpl),
        rewards=lambda: [_code_reward("fraction")], correct=_code_reward, extract=None,
        max_completion_length=512, splits=("test",),
        description="HumanEval: complete a Python function; all of check(candidate) must pass")


# ---- any JSONL file ----

JSONL_REWARDS = {"math": (lambda tpl: _math_rewards(tpl, strict=tpl.style != "plain"),
                          lambda tpl: _math_correct(tpl.style != "plain")),
                 "code": (lambda tpl: [_code_reward("fraction")], lambda tpl: _code_reward())}
"""`reward=` of a jsonl task -> (training rewards, correctness verifier), each for a template. Math answers are
read strictly (`<answer>`, `\\boxed{}`, `#### n`) when the prompts as sent ask for that format; a plain template
asks for none, nor do chat-message prompts, which no template wraps (`asked_template`), so there the final number
counts ("27 + 12 = 39" -> 39), in training and in evaluation alike."""


NO_FORMAT = TEMPLATES["plain"]
"""What a prompt that no template wrapped asks for (chat messages a jsonl task sends as they are): no answer format,
so the reply's final number counts, as in the plain templates."""


def wraps(prompt) -> bool:
    """Does a jsonl task's template wrap this prompt? A string: yes. Chat messages: no, they are sent as they are."""
    return not is_conversational(prompt)


def asked_template(template: PromptTemplate, prompts: list, where: str = "") -> PromptTemplate:
    """The one place that decides what a jsonl task's prompts, as sent, ask for, and so how it scores their replies:
    `template` when it wraps them (strings), NO_FORMAT when it wraps none (chat messages are sent as they are, so
    the template's format is never asked for and the final number counts). Prompts it wraps only in part raise when
    the template asks for a format (one verifier would be wrong for the others); no prompts: `template`.

    >>> asked_template(get_template("r1"), [[{"role": "user", "content": "What is 12 times 7?"}]]) is NO_FORMAT
    True
    """
    wrapped = {wraps(p) for p in prompts}
    if wrapped == {False}:
        return NO_FORMAT
    if wrapped == {True, False} and template.style != NO_FORMAT.style:
        raise ValueError(f"{where}: some prompts are chat messages, sent as they are, and some are strings, which the "
                         f"template wraps and asks for the '{template.style}' answer format; one verifier cannot "
                         "score both: give every row the same kind of prompt, or name a plain template (@plain)")
    return template


def _file_prompts(path: str | Path, prompt_column: str) -> list:
    """The prompt column of a jsonl task's file(s) as they are now (each split's file where the path has `{split}`);
    nothing from a file that cannot be read or a row without the column (loading them says why)."""
    prompts = []
    for file in sorted({str(path).replace("{split}", split) for split in ("train", "test")}):
        try:
            prompts += [r[prompt_column] for r in read_jsonl(file) if isinstance(r, dict) and prompt_column in r]
        except (OSError, ValueError):
            continue
    return prompts


def jsonl_rows(path: str | Path, prompt_column: str = "prompt", answer_column: str | None = "answer",
               template="r1") -> list[dict]:
    """Rows of a JSONL file: the prompt column through the template (chat lists kept as they are),
    the answer column copied to `answer`, every other column kept; `id` defaults to the line index."""
    path = Path(path)
    tpl = get_template(template)
    raw = read_jsonl(path)
    if not raw:
        raise ValueError(f"{path}: no rows")
    rows = []
    for i, r in enumerate(raw):
        for col in (prompt_column, answer_column):
            if col is not None and col not in r:
                raise ValueError(f"{path}: row {i} has no column '{col}'; columns: {sorted(r)}")
        p = r[prompt_column]
        row = {"id": i, **r, "prompt": tpl(p) if wraps(p) else p}
        if answer_column is not None:
            if r[answer_column] is None or not str(r[answer_column]).strip():
                raise ValueError(f"{path}: row {i} has an empty gold answer in column '{answer_column}'")
            row["answer"] = str(r[answer_column])
        rows.append(row)
    return rows


def jsonl_task(path: str | Path, prompt_column: str = "prompt", answer_column: str = "answer",
               template="r1", reward: str = "math", name: str | None = None) -> Task:
    """A task from one JSONL file, so a new benchmark needs no code. A `{split}` in the path picks
    a file per split (data/{split}.jsonl); without one, every split reads the same file.
    reward "math": the gold is in answer_column; "code": rows carry `tests` (and `entry_point` for
    HumanEval-style tests, and `code_prompt` when the prompt shows code: a body-only completion is completed with
    it, a whole function gets its imports and helpers, and the tests call its helpers); answer_column is unused.
    Rewards, correctness, format share and `stop` follow what the prompts ask for as sent (`asked_template`, read
    from the file(s) now): a file of chat-message prompts, which the template does not wrap, asks for no format."""
    if reward not in JSONL_REWARDS:
        raise ValueError(f"unknown reward '{reward}'; valid: {sorted(JSONL_REWARDS)}")
    tpl = get_template(template)
    asked = asked_template(tpl, _file_prompts(path, prompt_column), str(path))  # scoring follows it, not `tpl`
    train_rewards, correct = JSONL_REWARDS[reward]
    answer = answer_column if reward == "math" else None

    def load(split: str, n: int | None = None, seed: int = 0) -> list[dict]:
        check_split(name or f"jsonl:{path}", split, ("train", "test"))
        return subset(jsonl_rows(str(path).replace("{split}", split), prompt_column, answer, tpl), n, seed)

    return Task(name=name or f"jsonl:{path}", load=load, rewards=lambda: train_rewards(asked),
                correct=lambda: correct(asked), asks_format=asked.style == "r1",
                extract=extract_math_answer if reward == "math" else None,
                reward_weights=_weights(asked) if reward == "math" else None, stop=asked.stop,
                description=f"rows of {path}")


BUILDERS = {"gsm8k": gsm8k_task, "math500": math500_task, "humaneval": humaneval_task}
"""Benchmarks that take another prompt template by name: `gsm8k@boxed`, `math500@r1_base`."""


JSONL_OPTIONS = {"prompt": "prompt_column", "answer": "answer_column", "reward": "reward"}
"""`jsonl:PATH?prompt=q&answer=gold&reward=code` -> jsonl_task's arguments."""


def jsonl_task_from_name(name: str) -> Task:
    """`jsonl:PATH[@TEMPLATE][?prompt=COL&answer=COL&reward=math|code]` -> jsonl_task(PATH, ...)
    (`jsonl:data/qa.jsonl@plain?prompt=question&answer=gold`)."""
    from urllib.parse import parse_qsl
    spec, _, query = name.partition("?")
    options = {}
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key not in JSONL_OPTIONS:
            raise ValueError(f"unknown option '{key}' in task name '{name}'; valid: {sorted(JSONL_OPTIONS)}")
        options[JSONL_OPTIONS[key]] = value
    base, at, template = spec.rpartition("@")
    path, template = (base, template) if at and template in TEMPLATES else (spec, "r1")
    path = path[len("jsonl:"):]
    if not path:
        raise ValueError("empty path in task name 'jsonl:'; use jsonl:PATH/TO/FILE.jsonl")
    return jsonl_task(path, template=template, name=name, **options)


for _build in BUILDERS.values():
    register_task(_build())
