"""benchmarks/skills.py --spread: the seed-spread table from per-problem results, checked by hand."""

import importlib.util
import json
from pathlib import Path

from aha.stats import paired_gain, verdict

spec = importlib.util.spec_from_file_location("skills", Path(__file__).parents[1] / "benchmarks" / "skills.py")
skills = importlib.util.module_from_spec(spec)
spec.loader.exec_module(skills)


def run(correct: list[float]) -> dict:
    change, ci = paired_gain([0.0] * 100, correct)
    return {"accuracy": sum(correct) / len(correct), "correct": correct, "change": change, "change_ci95": list(ci),
            "verdict": verdict(ci)}


def test_spread_table_by_hand():
    base = {"accuracy": 0.0, "correct": [0.0] * 100}
    # three seeds against a base that got nothing right: +10, +20 and +30 points, each outside its interval;
    # mean 20, sd 10, t(2) = 4.303: 20 -+ 24.8
    results = {"chat_add": {"base": base, "s0": run([1.0] * 10 + [0.0] * 90), "s1": run([1.0] * 20 + [0.0] * 80),
                            "s2": run([1.0] * 30 + [0.0] * 70)},
               "chat_sub": {"base": base, **{s: run([0.0] * 100) for s in ("s0", "s1", "s2")}}}
    table = skills.spread_table(["base", "s0", "s1", "s2"], results)
    rows = table.splitlines()
    assert rows[2] == "| chat_add | 0.0% | +10.0 / +20.0 / +30.0 | +20.0 [-4.8, +44.8] | 3 / 0 / 0 |"
    assert rows[3] == "| chat_sub | 0.0% | +0.0 / +0.0 / +0.0 | +0.0 [+0.0, +0.0] | 0 / 3 / 0 |"


def test_the_results_file_keeps_earlier_models(tmp_path, monkeypatch):
    # a second call with other trained models adds them to skills.json and keeps the first call's
    def fake_table(models, tasks, dtype, known):
        results = {t: {m: known.get(t, {}).get(m) or run([1.0] * 10 + [0.0] * 90) for m in models} for t in tasks}
        return "table\n", results
    monkeypatch.setattr(skills, "accuracy_table", fake_table)
    for models in (["base", "a"], ["base", "b", "c"]):
        monkeypatch.setattr("sys.argv", ["skills.py", *models, "--tasks", "chat_add", "--out", str(tmp_path)])
        skills.main()
    assert sorted(json.loads((tmp_path / "skills.json").read_text())["chat_add"]) == ["a", "b", "base", "c"]
