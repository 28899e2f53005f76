"""The dashboard's API: every endpoint, traversal refused, bad and half-written lines reported, never a crash."""

import json
import math
import time

import pytest
import torch

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from aha import algos  # noqa: E402
from aha.cli import _normalise  # noqa: E402
from aha.config import DashboardConfig  # noqa: E402
from aha.dashboard import build_app  # noqa: E402
from aha.dashboard.runs import RunRegistry, read_jsonl, safe_file  # noqa: E402

GROUP = {"step": 2, "group": 0, "prompt": "1+1=", "answer": "2", "reward_names": ["math"], "mean": 0.5, "std": 0.7071,
         "completions": [{"text": "2 wait", "rewards": [1.0], "reward": 1.0, "advantage": 0.7071, "trained": True,
                          "tokens": {"piece": ["2", " wait"], "logp": [-0.1, -2.0], "ratio": [1.0, 1.3],
                                     "clip": [0, 1], "kl": None, "loss": [-0.2, -0.1]}},
                         {"text": "3", "rewards": [0.0], "reward": 0.0, "advantage": -0.7071, "trained": True,
                          "tokens": {"piece": ["3"], "logp": [-0.5], "ratio": [1.0], "clip": [0], "kl": None,
                                     "loss": [0.3]}}]}


def make_run(path, torn=True):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("model: tiny\nnum_generations: 2\nreflection_phrases: [wait]\n")
    lines = [json.dumps({"step": s, "reward/mean": s / 10, "behaviour/reflection_rate": 0.5}) for s in (1, 2, 3)]
    lines.insert(1, "{not json")
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n" + ('{"step": 4, "reward/me' if torn else ""))
    (path / "groups.jsonl").write_text(json.dumps(GROUP) + "\n")
    (path / "summary.json").write_text("{}")
    (path / "held_out.jsonl").write_text("".join(json.dumps({"step": s, "id": 7, "prompt": "2+2=", "answer": "4",
                                                             "greedy": g, "correct": g == "4"}) + "\n"
                                                 for s, g in ((0, "5"), (10, "4"))))
    return path


LOCAL = "http://127.0.0.1:8765"
"""What a browser on this machine sends as Host (TestClient's own "testserver" is a foreign name)."""


@pytest.fixture
def client(tmp_path):
    make_run(tmp_path / "runs" / "a")
    make_run(tmp_path / "runs" / "sub" / "b", torn=False)
    (tmp_path / "secret.txt").write_text("no")
    cfg = DashboardConfig(runs_root=str(tmp_path / "runs"), playground_dir=str(tmp_path / "pg"), playground_max_steps=3)
    with TestClient(build_app(cfg), base_url=LOCAL) as c:
        yield c


def test_page_and_vendored_chart_library_are_served(client):
    assert "aha dashboard" in client.get("/").text
    assert client.get("/static/app.js").status_code == 200
    assert "uPlot" in client.get("/static/vendor/uPlot.iife.min.js").text[:2000]
    assert "MIT" in client.get("/static/vendor/uPlot.LICENSE").text


def test_runs_lists_every_run_under_the_root(client):
    runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert set(runs) == {"a", "sub/b"}
    assert runs["a"]["steps"] == 3 and runs["a"]["last"]["reward/mean"] == pytest.approx(0.3)
    assert runs["a"]["config"] == {"model": "tiny", "num_generations": 2} and runs["a"]["has_groups"]
    assert "partial last line" in runs["a"]["last"]["_note"]


def test_metrics_report_bad_and_half_written_lines_and_read_on_from_an_offset(client, tmp_path):
    m = client.get("/api/metrics?run=a").json()
    assert m["step"] == [1, 2, 3] and m["series"]["reward/mean"] == pytest.approx([0.1, 0.2, 0.3])
    assert m["bad"][0]["text"] == "{not json"
    assert m["partial"]["text"] == '{"step": 4, "reward/me'  # being written: shown, not parsed, not skipped for good
    path = tmp_path / "runs" / "a" / "metrics.jsonl"
    with open(path, "a") as f:
        f.write('an": 0.4}\n')  # the writer finishes the line
    more = client.get(f"/api/metrics?run=a&offset={m['offset']}").json()
    assert more["step"] == [4] and more["series"]["reward/mean"] == [0.4] and more["partial"] is None
    assert client.get(f"/api/metrics?run=a&offset={10 ** 9}").json()["reset"]  # a rewritten file: from 0 again


def test_groups_and_aha(client):
    g = client.get("/api/groups?run=a").json()
    assert g["steps"] == [2] and g["groups"][0]["completions"][0]["tokens"]["ratio"] == [1.0, 1.3]
    assert client.get("/api/groups?run=a&step=7").json()["groups"] == []
    aha = client.get("/api/aha?run=a").json()
    assert aha["phrases"] == ["wait"] and aha["steps"] == [{"step": 2, "completions": 2, "reflective": 1,
                                                            "example": "2 wait"}]
    held = aha["held_out"]
    assert held["steps"] == [0, 10] and held["problems"][0]["by_step"] == {
        "0": {"greedy": "5", "correct": False}, "10": {"greedy": "4", "correct": True}}


def test_path_traversal_is_refused(client):
    assert client.get("/api/file?run=a&path=summary.json").json() == {}
    for bad in ("../../secret.txt", "../sub/b/summary.json", "/etc/passwd", "%2e%2e/%2e%2e/secret.txt", ""):
        r = client.get(f"/api/file?run=a&path={bad}")
        assert r.status_code == 403, bad
    assert client.get("/api/file?run=../secret.txt&path=x").status_code == 404  # run ids are names, not paths
    assert client.get("/static/../../../secret.txt").status_code == 404
    assert client.get("/api/metrics?run=..").status_code == 404


def test_a_link_out_of_the_run_is_refused(tmp_path):
    run = make_run(tmp_path / "r")
    (tmp_path / "outside.txt").write_text("x")
    (run / "link.txt").symlink_to(tmp_path / "outside.txt")
    assert safe_file(run, "link.txt") is None and safe_file(run, "summary.json") == run / "summary.json"


def test_unreadable_files_are_errors_in_the_answer_not_crashes(client, tmp_path):
    (tmp_path / "runs" / "a" / "config.yaml").write_text("a: [unclosed")
    (tmp_path / "runs" / "a" / "groups.jsonl").write_text("garbage\n" + json.dumps(GROUP) + "\n")
    runs = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}
    assert "config.yaml" in runs["a"]["config_error"]
    assert client.get("/api/groups?run=a").json()["steps"] == [2]
    assert client.get("/api/learn/advantages", ).status_code == 405
    assert client.post("/api/learn/advantages", content=b"{", headers=JSON).status_code == 400
    assert "rewards" in client.post("/api/learn/advantages", json={"rewards": [1]}).json()["error"]
    assert client.post("/api/learn/ratio", json={"p_old": 0, "p_new": 0.5}).status_code == 400


JSON = {"content-type": "application/json"}


def test_a_cross_site_post_is_refused_and_starts_nothing(client):
    body = b'{"max_steps": 1}'
    simple = {"content-type": "text/plain", "origin": "http://evil.example"}  # a form/fetch with no preflight
    assert client.post("/api/playground/start", content=body, headers=simple).status_code == 403
    refused = [{**JSON, "origin": "http://evil.example"}, {**JSON, "origin": "null"},
               {**JSON, "origin": "http://localhost.evil.example:8765"}, {**JSON, "origin": "file://"},
               {**JSON, "sec-fetch-site": "cross-site"}, {"content-type": "text/plain"}, {}]
    for headers in refused:
        assert client.post("/api/playground/start", content=body, headers=headers).status_code in (403, 415), headers
    assert client.get("/api/playground").json()["jobs"] == []
    for origin in ("http://127.0.0.1:8765", "http://localhost:3000", "https://[::1]"):  # any port: tunnels
        ok = {"content-type": "application/json; charset=utf-8", "origin": origin, "sec-fetch-site": "same-origin"}
        assert client.post("/api/learn/kl", content=b'{"p": 1, "p_ref": 0.5}', headers=ok).status_code == 200
    assert client.post("/api/learn/kl", json={"p": 1, "p_ref": 0.5}).status_code == 200  # no Origin: not a browser


def test_a_foreign_host_is_refused_so_dns_rebinding_reads_nothing(client, tmp_path):
    for host in ("evil.example", "evil.example:8765", "127.0.0.1.evil.example", "localhost:80x", ""):
        r = client.get("/api/runs", headers={"host": host})
        assert r.status_code == 421 and "runs" not in r.json(), host
    assert client.get("/api/file?run=a&path=summary.json", headers={"host": "evil.example"}).status_code == 421
    for host in ("localhost", "LOCALHOST:1", "127.0.0.1:9", "[::1]:8765"):
        assert client.get("/api/runs", headers={"host": host}).status_code == 200, host
    cfg = DashboardConfig(runs_root=str(tmp_path / "runs"), host="dash.lan", playground_dir=str(tmp_path / "pg"))
    with TestClient(build_app(cfg), base_url="http://dash.lan:8443") as c:
        assert c.get("/api/runs").status_code == 200 and c.get("/", headers={"host": "other.lan"}).status_code == 421


def test_a_run_folder_linked_out_of_the_root_is_neither_listed_nor_served(client, tmp_path):
    make_run(tmp_path / "elsewhere" / "r")
    (tmp_path / "runs" / "evil").symlink_to(tmp_path / "elsewhere" / "r")
    (tmp_path / "runs" / "deep").symlink_to(tmp_path / "elsewhere")  # a run one level under a link out
    (tmp_path / "runs" / "alias").symlink_to(tmp_path / "runs" / "a")  # a link that stays inside is fine
    (tmp_path / "runs" / "c").mkdir()
    (tmp_path / "runs" / "c" / "config.yaml").write_text("model: tiny\n")
    (tmp_path / "runs" / "c" / "metrics.jsonl").symlink_to(tmp_path / "secret.txt")  # a run file linked out
    assert {r["id"] for r in client.get("/api/runs").json()["runs"]} == {"a", "sub/b", "alias", "c"}
    for run in ("evil", "deep/r"):
        assert client.get(f"/api/file?run={run}&path=summary.json").status_code == 404
        assert client.get(f"/api/metrics?run={run}").status_code == 404
    assert client.get("/api/metrics?run=c").json()["missing"] and client.get("/api/file?run=c&path=metrics.jsonl"
                                                                             ).status_code == 403
    assert client.get("/api/file?run=alias&path=summary.json").json() == {}


def test_learn_numbers_are_aha_algos_own(client):
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.0]
    got = client.post("/api/learn/advantages", json={"rewards": rewards}).json()
    for name in algos.ADVANTAGES:
        want = algos.compute_advantages(name, torch.tensor(rewards), 6)[0].tolist()
        assert got["advantages"][name] == pytest.approx(want, abs=1e-6)
    r = client.post("/api/learn/ratio", json={"p_old": 0.5, "p_new": 0.8, "epsilon": 0.2, "epsilon_high": 0.28}).json()
    assert r["ratio"] == pytest.approx(1.6)
    assert r["by_advantage"]["positive"]["objective"] == pytest.approx(1.28) and r["by_advantage"]["positive"]["clipped"]
    assert r["by_advantage"]["negative"]["objective"] == pytest.approx(-1.6)  # min(-1.6, -1.28): no clip for A < 0
    assert not r["by_advantage"]["negative"]["clipped"]
    kl = client.post("/api/learn/kl", json={"p": 1.0, "p_ref": 0.5}).json()["values"]
    assert kl["k3"] == pytest.approx(0.193147, abs=1e-5)  # 0.5 - 1 + ln 2, as in algos.kl_k3's docstring
    assert kl["k1"] == pytest.approx(0.693147, abs=1e-5) and kl["k2"] == pytest.approx(0.5 * 0.693147 ** 2, abs=1e-5)


def test_playground_start_is_bounded_single_and_cancellable(client, tmp_path):
    assert client.post("/api/playground/start", json={"max_steps": 99}).status_code == 400  # over the cap of 3
    assert client.post("/api/playground/start", json={"num_generations": 1}).status_code == 400
    job = client.post("/api/playground/start", json={"max_steps": 3}).json()
    assert job["state"] == "running" and job["params"]["max_steps"] == 3
    assert "already" in client.post("/api/playground/start", json={}).json()["error"]
    assert client.post("/api/playground/cancel", json={}).json()["cancelled"]
    st = client.get("/api/playground").json()
    assert not st["running"] and st["jobs"][0]["state"] == "cancelled"
    assert client.get(f"/api/metrics?run={job['id']}").status_code == 200  # its directory is a run


def test_explicit_run_dirs_and_cli_words(tmp_path):
    a, b = make_run(tmp_path / "x" / "run"), make_run(tmp_path / "y" / "run")
    assert list(RunRegistry([a, b]).runs()) == ["run", "run-2"]
    assert _normalise(["runs/a", "runs/b", "--port", "9"], "runs") == ["port=9", 'runs=["runs/a", "runs/b"]']
    assert DashboardConfig().host == "127.0.0.1"


def test_a_large_metrics_file_reads_fast(tmp_path):
    row = {f"metric/{i}": 0.5 for i in range(40)}
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, **row}) + "\n" for s in range(10_000)))
    t0 = time.perf_counter()
    got = read_jsonl(path)
    assert len(got["rows"]) == 10_000 and time.perf_counter() - t0 < 2.0


def test_train_with_dashboard_true_serves_the_run(tiny_dir, tmp_path, capsys):
    import urllib.request

    from aha.config import GRPOConfig
    from aha.stages import run_grpo
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+1="}) + "\n" for a in range(8)))
    run_grpo(GRPOConfig(output_dir=str(tmp_path / "run"), model=tiny_dir, dataset=str(data), reward_funcs=["format"],
                        max_steps=1, num_generations=2, per_device_train_batch_size=4, max_completion_length=4,
                        progress_bar=False, report_to=["jsonl"], dashboard=True, dashboard_port=0))
    url = capsys.readouterr().out.split("aha dashboard: ")[1].split()[0]
    assert url.startswith("http://127.0.0.1:")
    runs = json.loads(urllib.request.urlopen(f"{url}/api/runs", timeout=10).read())["runs"]
    assert [(r["id"], r["steps"]) for r in runs] == [("run", 1)]


# ---------------------------------------------------------------- runs where they are; Learn's new numbers
def test_a_folder_given_by_name_lists_the_runs_nested_in_it(tmp_path):
    """`aha dashboard runs/demo`: demo/sft and demo/grpo (and the demo's own folder, a run marker of its own)."""
    demo = tmp_path / "runs" / "demo"
    make_run(demo / "grpo")
    make_run(demo / "sft")
    (demo / "base").mkdir()
    (demo / "base" / "config.json").write_text("{}")  # a model, not a run
    (demo / "demo_config.yaml").write_text("grpo_steps: 3\n")
    make_run(tmp_path / "recipe" / "stage1")  # a recipe: no marker of its own, its stages are the runs
    make_run(tmp_path / "plain")
    make_run(tmp_path / "plain" / "checkpoint-3")  # never a run
    reg = RunRegistry([demo, tmp_path / "recipe", tmp_path / "plain", tmp_path / "typo"])
    assert list(reg.runs()) == ["demo", "demo/grpo", "demo/sft", "recipe/stage1", "plain", "typo"]
    assert reg.empty() == [str(tmp_path / "typo")]  # watched (a run may start there), and said to hold none
    cfg = DashboardConfig(runs=[str(demo)], playground_dir=str(tmp_path / "pg"))
    with TestClient(build_app(cfg), base_url=LOCAL) as c:
        got = c.get("/api/runs").json()
        runs = {r["id"]: r for r in got["runs"]}
        assert runs["demo/grpo"]["steps"] == 3 and runs["demo"]["stage"] == "demo" and not runs["demo"]["has_metrics"]
        assert runs["demo/grpo"]["stage"] == "grpo" and got["given"] == [str(demo)] and got["empty"] == []
        assert c.get("/api/groups?run=demo/grpo").json()["steps"] == [2]


def test_config_diff_lists_the_keys_that_differ(client, tmp_path):
    (tmp_path / "runs" / "sub" / "b" / "config.yaml").write_text("model: tiny\nnum_generations: 4\nbeta: 0.1\n"
                                                                "reflection_phrases: [wait]\noutput_dir: x\n")
    d = client.get("/api/config_diff?runs=a,sub/b").json()
    assert d["differ"] == {"num_generations": [2, 4], "beta": [None, 0.1]} and d["same"] == 2
    assert client.get("/api/config_diff?runs=a,nope").status_code == 404


def test_prompts_are_shown_as_their_question():
    from aha.dashboard.text import prompt_text
    chatml = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+6<|im_end|>\n<|im_start|>assistant\n"
    assert prompt_text(chatml) == "1+6"
    llama = ("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
             "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert prompt_text(llama) == "Hi"
    assert prompt_text([{"role": "system", "content": "x"}, {"role": "user", "content": "2+2"}]) == "2+2"
    assert prompt_text("1+6=") == "1+6=" and prompt_text(None) == ""


def test_held_out_and_groups_carry_the_question(client, tmp_path):
    import json as _json
    (tmp_path / "runs" / "a" / "held_out.jsonl").write_text(_json.dumps(
        {"step": 0, "id": 1, "prompt": "<|im_start|>user\n3+4<|im_end|>\n<|im_start|>assistant\n", "answer": "7",
         "greedy": "7", "correct": True}) + "\n")
    assert client.get("/api/aha?run=a").json()["held_out"]["problems"][0]["prompt_text"] == "3+4"
    assert client.get("/api/groups?run=a").json()["groups"][0]["prompt_text"] == "1+1="



def _held_out_row(step, pid, greedy, correct, first_right, corrects, prompt="<|im_start|>user\n47+385<|im_end|>\n"):
    """One held_out.jsonl line of `aha demo aha` (aha.eval.make_eval_fn's answer with its check's parse)."""
    return {"step": step, "id": pid, "prompt": prompt, "answer": "432", "greedy": greedy, "correct": correct,
            "reflects": corrects or first_right is not None, "corrects": corrects, "first_right": first_right,
            "empty": False}


WRONG = "<think>7+5=12 4+8=12 0+3=3 so 422</think><answer>422</answer>"
FIXED = "<think>7+5=12 4+8=12 0+3=3 so 422 check: 7+5=12 4+8+1=13 0+3+1=4 wait 432</think><answer>432</answer>"


def test_the_aha_moment_is_the_first_wait_that_fixes_a_problem_answered_wrong_before(tmp_path):
    """The rule of summary.json's fixed_by_reflection (aha.behaviour.first_fixes), with the last wrong answer before."""
    from aha.dashboard.runs import aha_moments
    rows = [_held_out_row(0, 7, WRONG, False, False, False), _held_out_row(0, 8, "432", True, True, False),
            _held_out_row(20, 7, WRONG, False, False, False),
            _held_out_row(20, 8, FIXED, True, False, True),     # fixed by a wait, but right at the evaluation before
            _held_out_row(40, 7, FIXED, True, False, True),     # wrong at 20, fixed by a wait at 40: the moment
            _held_out_row(60, 7, FIXED, True, False, True)]     # fixed again: not a new moment
    path = tmp_path / "held_out.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows[::-1]))  # in any order
    got = aha_moments(path)
    assert got == {"checked": True, "moments": [
        {"id": 7, "prompt_text": "47+385", "answer": "432", "step": 40, "before": {"step": 20, "greedy": WRONG},
         "after": {"step": 40, "greedy": FIXED}}]}
    right_then = [_held_out_row(0, 7, WRONG, False, False, False), _held_out_row(20, 7, "432", True, True, False),
                  _held_out_row(40, 7, FIXED, True, False, True),  # wrong two evaluations before: still its moment
                  _held_out_row(20, 9, WRONG, False, False, False),
                  _held_out_row(40, 9, "432 wait 432", True, True, True)]  # right first: the wait fixed nothing
    path.write_text("".join(json.dumps(r) + "\n" for r in right_then))
    assert [(m["id"], m["step"], m["before"]) for m in aha_moments(path)["moments"]] == [
        (7, 40, {"step": 0, "greedy": WRONG})]
    path.write_text("".join(json.dumps(r) + "\n" for r in right_then[3:]))
    assert aha_moments(path) == {"checked": True, "moments": []}
    path.write_text(json.dumps({"step": 0, "id": 1, "prompt": "1+1", "greedy": "2", "correct": True}) + "\n")
    assert aha_moments(path) == {"checked": False, "moments": []}  # answers that do not say what a check did
    assert aha_moments(None) == {"checked": False, "moments": []} == aha_moments(tmp_path / "absent.jsonl")


def test_the_aha_api_answers_the_moments_and_groups_carry_an_episodes_turns(client, tmp_path):
    run = tmp_path / "runs" / "a"
    (run / "held_out.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (
        _held_out_row(0, 7, WRONG, False, False, False), _held_out_row(10, 7, FIXED, True, False, True))))
    moments = client.get("/api/aha?run=a").json()["moments"]
    assert moments["checked"] and [(m["id"], m["step"], m["before"]["greedy"]) for m in moments["moments"]] == [
        (7, 10, WRONG)]
    episode = {**GROUP["completions"][1], "prompt": [{"role": "user", "content": "Count to 3. Reach 3."}],
               "turns": [{"role": "assistant", "start": 0, "end": 1, "text": "3",
                          "tool_calls": [{"name": "inc", "arguments": {"step": 1}, "error": None}]},
                         {"role": "tool", "start": 1, "end": 2,
                          "calls": [{"name": "inc", "outcome": "ok", "content": "1"}]}],
               "finish": "stop"}
    episode["tokens"] = {**episode["tokens"], "piece": ["3", "1"], "model": [1, 0]}
    (run / "groups.jsonl").write_text(json.dumps({**GROUP, "completions": [episode]}) + "\n")
    got = client.get("/api/groups?run=a").json()["groups"][0]["completions"][0]
    assert got["turns"] == episode["turns"] and got["tokens"]["model"] == [1, 0] and got["finish"] == "stop"
    assert got["prompt_text"] == "Count to 3. Reach 3."  # the episode's own prompt, after its environment's reset

def test_learn_advantages_explain_every_estimator_and_give_an_equal_group_zero(client):
    got = client.post("/api/learn/advantages", json={"rewards": [1.6] * 8}).json()
    assert all(v == [0.0] * 8 for v in got["advantages"].values()) and got["std"] == 0.0
    assert set(got["about"]) == set(algos.ADVANTAGES)
    assert all(a["formula"].startswith("A_i =") and a["doc"] for a in got["about"].values())
    two = client.post("/api/learn/advantages", json={"rewards": [1, 0, 0, 1], "other": [0, 0, 0, 1]}).json()
    want = algos.compute_advantages("batch", torch.tensor([1.0, 0, 0, 1, 0, 0, 0, 1]), 4)[0].tolist()
    assert two["advantages"]["batch"] + two["other_advantages"]["batch"] == pytest.approx(want, abs=1e-6)
    assert client.post("/api/learn/advantages", json={"rewards": [1, 0], "other": [1]}).status_code == 400


def test_learn_ratio_kl_and_aggregation(client):
    r = client.post("/api/learn/ratio", json={"p_old": 0.5, "p_new": 0.7, "epsilon": 0.2, "epsilon_high": 0.28}).json()
    assert r["clip_range"] == [0.8, 1.28]
    kl = client.post("/api/learn/kl", json={"p": 0.3, "p_ref": 0.5}).json()
    true = 0.3 * math.log(0.3 / 0.5) + 0.7 * math.log(0.7 / 0.5)  # KL({0.3, 0.7} || {0.5, 0.5})
    assert kl["true_kl"] == pytest.approx(true, abs=1e-6)
    assert kl["expected"]["k1"] == pytest.approx(true, abs=1e-6) and kl["expected"]["k3"] == pytest.approx(true, abs=1e-6)
    assert kl["expected"]["k2"] != pytest.approx(true, abs=1e-3)  # k2 is biased
    assert client.post("/api/learn/kl", json={"p": 0.3, "p_ref": 1.0}).json()["true_kl"] is None  # infinite
    agg = client.post("/api/learn/aggregation", json={"short": 2, "long": 6, "max_len": 10}).json()["by_loss_type"]
    assert agg["grpo"]["short"] == pytest.approx([0.25] * 2)
    assert agg["grpo"]["long"] == pytest.approx([1 / 12] * 6, abs=1e-6)
    assert agg["dapo"]["total"] == pytest.approx({"short": 0.25, "long": 0.75})  # 2 and 6 of 8 tokens
    assert agg["dr_grpo"]["long"] == pytest.approx([1 / 20] * 6, abs=1e-6)  # 1 / (2 sequences * max_len 10)
    assert client.post("/api/learn/aggregation", json={"short": 2, "long": 6, "max_len": 3}).status_code == 400


def test_learn_toy_update_is_grpo_with_aha_loss_and_optimizer(client):
    body = {"rewards": [1, 1, 0, 0.5, 0, 0], "learning_rate": 0.1}
    first = client.post("/api/learn/toy", json=body).json()
    assert sum(first["after"]) == pytest.approx(1, abs=1e-5) and first["after"][0] > first["before"][0]
    assert first["after"][2] < first["before"][2] and first["state"]["step"] == 1.0
    assert first["change"] == pytest.approx([a - b for a, b in zip(first["after"], first["before"])], abs=2e-6)
    second = client.post("/api/learn/toy", json={**body, "state": first["state"]}).json()
    assert second["before"] == pytest.approx(first["after"], abs=1e-6) and second["state"]["step"] == 2.0
    clipped = client.post("/api/learn/toy", json={**body, "passes": 4, "learning_rate": 0.5}).json()
    assert len(clipped["loss"]) == 4 and clipped["clipped"][0] == 0 and max(clipped["clipped"]) > 0
    assert client.post("/api/learn/toy", json={**body, "rewards": [1, 2]}).status_code == 400
    assert client.post("/api/learn/toy", json={**body, "estimator": "nope"}).status_code == 400
    assert client.post("/api/learn/toy", json={**body, "state": {"logits": [1e9] * 6}}).status_code == 400


def _by_algos(steps, outcomes):
    """The example's advantages by aha.algos: every answer has its 3 column steps on tokens 1, 2, 3 and its
    outcome on its last token, 6 (7 tokens), G = 4."""
    outcome = torch.tensor(outcomes, dtype=torch.float32)             # [N=4]
    seq = torch.arange(4).repeat_interleave(3)                        # [S=12]
    token = torch.tensor([1, 2, 3] * 4)                               # [S]
    score = torch.tensor([s for st in steps for s in st], dtype=torch.float32)  # [S]
    process, _ = algos.process_advantages(outcome, torch.full((4,), 6), seq, token, score, 7, 4)  # [N,T]
    per_answer, _ = algos.compute_advantages("grpo", outcome, 4)      # [N]
    return process, per_answer


def test_learn_process_supervision_is_aha_algos_own(client):
    got = client.post("/api/learn/supervision", json={}).json()
    steps = [[s["score"] for s in c["steps"]] for c in got["completions"]]
    outcomes = [c["outcome"]["score"] for c in got["completions"]]
    # the arithmetic task's rewards on the example: a dropped carry in answer 2 (right answer), a miscopied answer 3
    assert steps == [[1, 1, 1], [1, 0, 1], [1, 1, 1], [1, 0, 0]] and outcomes == [1, 1, 0, 0]
    assert all([s["token"] for s in c["steps"]] == [1, 2, 3] and c["outcome"]["token"] == 6 for c in got["completions"])
    process, per_answer = _by_algos(steps, outcomes)
    for i, c in enumerate(got["completions"]):
        assert c["process_advantage"] == pytest.approx(process[i].tolist(), abs=1e-6)
        assert c["outcome_advantage"] == pytest.approx([float(per_answer[i])] * 7, abs=1e-6)
        for s in c["steps"]:  # a step's normalised reward is the jump in advantage at its end token
            assert s["normalised"] == pytest.approx(float(process[i, s["token"]] - process[i, s["token"] + 1]), abs=1e-5)
    # pool: 11 ones and 5 zeros -> mean 11/16, unbiased std sqrt(880/3840); a wrong step -0.6875/(0.478714+1e-4)
    assert got["pool"] == {"size": 16, "mean": 0.6875, "std": pytest.approx(math.sqrt(880 / 3840), abs=1e-6)}
    assert got["completions"][1]["steps"][1]["normalised"] == pytest.approx(-0.6875 / (math.sqrt(880 / 3840) + 1e-4), abs=1e-6)
    # answer 2's tokens up to its wrong step: 0.6527 (step 1) - 1.4358 (step 2) + 0.6527 (step 3) + 0.6527 (outcome)
    assert got["completions"][1]["process_advantage"][1] == pytest.approx(0.522124, abs=1e-5)
    assert got["completions"][1]["process_advantage"][:3] != got["completions"][0]["process_advantage"][:3]
    toggled = [[1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0]]
    again = client.post("/api/learn/supervision", json={"steps": toggled, "outcomes": outcomes}).json()
    process, _ = _by_algos(toggled, outcomes)
    shown = [v for c in again["completions"] for v in c["process_advantage"]]
    assert shown == pytest.approx(process.reshape(-1).tolist(), abs=1e-6)


def test_learn_process_supervision_refuses_bad_scores(client):
    short = client.post("/api/learn/supervision", json={"steps": [[1, 1]]})
    assert short.status_code == 400 and "steps must be 4 lists of 3, 3, 3, 3 numbers" in short.json()["error"]
    assert "outcomes must be 4 numbers" in client.post("/api/learn/supervision", json={"outcomes": [1, 0]}).json()["error"]
    for bad in ("x", True, 1e9, None):
        r = client.post("/api/learn/supervision", json={"outcomes": [1, 1, 0, bad]})
        assert r.status_code == 400 and "outcomes must be a number in [-10.0, 10.0]" in r.json()["error"], bad
    assert client.post("/api/learn/supervision", json={"steps": [[1, 1, 1]] * 3 + [[1, "no", 1]]}).status_code == 400


# ---------------------------------------------------------------- run files a careless or hostile writer left
def strict(r):
    """An answer parsed as a browser's JSON.parse reads it: NaN, Infinity and -Infinity are not JSON."""
    assert r.status_code == 200, r.text[:300]
    return json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in the answer: {r.text[:200]}"))


def test_a_nan_or_infinity_in_a_run_file_is_a_gap_and_every_answer_is_strict_json(client, tmp_path):
    run = tmp_path / "runs" / "a"
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": NaN, "reward/mean": 0.5}\n'
                                       '{"step": 2, "loss": 0.25, "reward/mean": Infinity}\n'
                                       '{"step": 3, "loss": -Infinity, "reward/mean": NaN}\n')  # the last line: NaN
    (run / "config.yaml").write_text("model: tiny\nnum_generations: 2\nbeta: .nan\nlearning_rate: .inf\n")
    first = {**GROUP["completions"][0], "advantage": math.inf}
    first["tokens"] = {**first["tokens"], "logp": [-math.inf, -2.0]}
    (run / "groups.jsonl").write_text(json.dumps({**GROUP, "mean": math.nan, "completions": [first]}) + "\n")
    (run / "held_out.jsonl").write_text(json.dumps({"step": 0, "id": 7, "prompt": "2+2=", "answer": "4",
                                                    "greedy": "4", "correct": True, "score": math.nan}) + "\n")
    m = strict(client.get("/api/metrics?run=a"))
    assert m["step"] == [1, 2, 3] and m["bad"] == []
    assert m["series"]["loss"] == [None, 0.25, None] and m["series"]["reward/mean"] == [0.5, None, None]
    assert strict(client.get(f"/api/metrics?run=a&offset={len(run.joinpath('metrics.jsonl').read_bytes()) - 60}"))
    runs = {r["id"]: r for r in strict(client.get("/api/runs"))["runs"]}
    assert set(runs) == {"a", "sub/b"} and runs["sub/b"]["last"]["reward/mean"] == pytest.approx(0.3)  # every run
    assert runs["a"]["steps"] == 3 and runs["a"]["last"]["reward/mean"] is None  # the last value, a gap: not 0.5
    assert runs["a"]["config"]["beta"] is None and runs["a"]["config"]["learning_rate"] is None
    g = strict(client.get("/api/groups?run=a"))["groups"][0]
    assert g["mean"] is None and g["completions"][0]["advantage"] is None
    assert g["completions"][0]["tokens"]["logp"] == [None, -2.0]
    aha = strict(client.get("/api/aha?run=a"))
    assert aha["steps"][0]["reflective"] == 1 and aha["held_out"]["problems"][0]["by_step"]["0"]["correct"]
    assert "beta" in strict(client.get("/api/config_diff?runs=a,sub/b"))["differ"]


def _lines_of(entries):
    return [(e["file"], e["line"]) for e in entries]


def test_a_malformed_line_is_reported_with_its_file_and_line_and_the_rest_is_served(client, tmp_path):
    run = tmp_path / "runs" / "a"
    deep = "[" * 100_000 + "]" * 100_000  # nested past any parser's depth
    (run / "metrics.jsonl").write_text("\n".join([
        '{"step": 1, "reward/mean": 0.1}', "{not json", "[1, 2]", '{"step": "x", "reward/mean": 9}',
        '{"step": 2, "reward/mean": 0.2}', deep, '{"step": 3, "reward/mean": 0.3}', '{"step": true}']) + "\n")
    m = strict(client.get("/api/metrics?run=a"))
    assert m["step"] == [1, 2, 3] and m["series"]["reward/mean"] == [0.1, 0.2, 0.3]
    assert _lines_of(m["bad"]) == [("metrics.jsonl", n) for n in (2, 3, 4, 6, 8)]
    assert [b["error"] for b in m["bad"]][1:3] == ["metrics.jsonl line 3: not a JSON object",
                                                   "metrics.jsonl line 4: step is not an integer"]
    assert m["bad"][0]["text"] == "{not json" and m["bad"][3]["error"].endswith("nested too deep")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "reward/mean": 0.4}\n{"step": 5, "reward/mean": [0.5]\n')  # read on from the offset
    more = strict(client.get(f"/api/metrics?run=a&offset={m['offset']}"))
    assert more["step"] == [4] and _lines_of(more["bad"]) == [("metrics.jsonl", 10)]
    c0 = GROUP["completions"][0]
    shapes = [{"completions": "x"}, {"completions": [None]}, {"completions": [{**c0, "text": 7}]},
              {"completions": [{**c0, "tokens": {"piece": "2 wait"}}]}, {"reward_names": "math"},
              {"completions": [{**c0, "turns": [{"role": "tool", "calls": "x"}]}]}]
    (run / "groups.jsonl").write_text("\n".join([
        json.dumps(GROUP), *[json.dumps({**GROUP, **s}) for s in shapes],                      # lines 1-7
        "garbage", '{"step": 2, "group": 5, broken', '{"step": 2, "x": ' + deep + "}",        # lines 8-10
        json.dumps({**GROUP, "step": 3}, separators=(",", ":"))]) + "\n")                     # line 11: another writer
    got = strict(client.get("/api/groups?run=a&step=2"))
    assert got["steps"] == [2, 3] and got["groups"][0]["completions"][0]["text"] == "2 wait"
    errors = got["groups"][1:]
    assert _lines_of(errors) == [("groups.jsonl", n) for n in (2, 3, 4, 5, 6, 7, 9, 10)]
    assert all(e["error"].startswith(f"groups.jsonl line {e['line']}: ") for e in errors)
    assert "completions" in errors[0]["error"] and "text" in errors[2]["error"] and "reward_names" in errors[4]["error"]
    assert _lines_of(got["bad"]) == [("groups.jsonl", 8)]  # a line of no step: shown with every step
    assert strict(client.get("/api/groups?run=a&step=3"))["groups"][0]["group"] == 0
    (run / "held_out.jsonl").write_text("\n".join([
        json.dumps({"step": 0, "id": 7, "prompt": "2+2=", "answer": "4", "greedy": "5", "correct": False}),
        json.dumps({"step": 0, "id": [7], "greedy": "4"}), json.dumps({"step": "x", "id": 8}), "[]",
        json.dumps({"step": 10, "id": 7, "prompt": "2+2=", "answer": "4", "greedy": "4", "correct": True})]) + "\n")
    aha = strict(client.get("/api/aha?run=a"))
    assert aha["steps"] == [{"step": 2, "completions": 2, "reflective": 1, "example": "2 wait"},
                            {"step": 3, "completions": 2, "reflective": 1, "example": "2 wait"}]
    assert _lines_of(aha["bad"]) == [("groups.jsonl", n) for n in (2, 3, 4, 5, 6, 7, 8, 9, 10)]
    assert _lines_of(aha["held_out"]["bad"]) == [("held_out.jsonl", n) for n in (2, 3, 4)]
    assert aha["held_out"]["steps"] == [0, 10] and len(aha["held_out"]["problems"]) == 1
    assert {r["id"] for r in strict(client.get("/api/runs"))["runs"]} == {"a", "sub/b"}


PNG = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                    "1f15c4890000000d49444154789c6360000002000100e527de780000000049454e44ae426082")
"""A 1x1 PNG image."""


def test_run_files_are_served_inert_and_only_of_the_types_the_pages_link(client, tmp_path):
    run = tmp_path / "runs" / "a"
    live = {"evil.html": "<script>fetch('/api/runs')</script>", "evil.htm": "<script></script>",
            "evil.svg": '<svg xmlns="http://www.w3.org/2000/svg"><script>fetch("/api/runs")</script></svg>',
            "evil.js": "fetch('/api/runs')", "evil.xhtml": "<html/>", "notes.txt": "x", "metrics.PNG": "x",
            "groups.jsonl.html": "<script></script>"}
    for name, text in live.items():
        (run / name).write_text(text)
    (run / "metrics.png").write_bytes(PNG)
    (run / "fake.png").write_text("<html><script>fetch('/api/runs')</script></html>")  # HTML named .png
    (run / "notes.md").write_text("<script>fetch('/api/runs')</script>")
    for name in (*live, "groups.jsonl"):
        r = client.get(f"/api/file?run=a&path={name}")
        assert r.status_code == 403 and "are served" in r.json()["error"], name
    listed = {r["id"]: r for r in client.get("/api/runs").json()["runs"]}["a"]["files"]
    assert listed == ["config.yaml", "fake.png", "metrics.png", "notes.md", "summary.json"]  # what the Runs page links
    for name in listed:
        r = client.get(f"/api/file?run=a&path={name}")
        assert r.status_code == 200 and r.headers["x-content-type-options"] == "nosniff", name
        assert "default-src 'none'" in r.headers["content-security-policy"] and "sandbox" in r.headers[
            "content-security-policy"], name
        if name.endswith(".png"):  # shown in a tab, as an image only
            assert r.headers["content-type"] == "image/png" and "content-disposition" not in r.headers
        else:
            assert r.headers["content-disposition"].startswith("attachment"), name
            assert r.headers["content-type"].split(";")[0] in ("application/json", "text/plain"), name
    assert client.get("/api/file?run=a&path=metrics.png").content == PNG


def test_the_apps_own_pages_and_answers_are_sent_with_nosniff_and_a_csp(client):
    for path in ("/", "/static/app.js", "/static/vendor/uPlot.min.css", "/api/runs", "/api/file?run=a&path=x.html"):
        r = client.get(path)
        csp = r.headers.get("content-security-policy", "")
        assert r.headers.get("x-content-type-options") == "nosniff", path
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp or "default-src 'none'" in csp, path
        assert "unsafe-eval" not in csp and "script-src 'self' 'unsafe-inline'" not in csp, path


def test_learn_loss_explainer_lists_every_surrogate_and_loss_type(client):
    got = client.post("/api/learn/aggregation", json={"short": 2, "long": 6, "max_len": 10}).json()
    sg = got["surrogates"]
    assert set(sg) - {"ratios"} == set(algos.SURROGATES) and sg["ratios"] == [0.5, 0.8, 1.0, 1.2, 1.5, 2.0]
    assert got["loss_types"] == {n: t._asdict() for n, t in algos.LOSS_TYPES.items()}
    # the objective's weight on grad log pi: clip r (A = +1) inside [0.8, 1.28], 0 past it; A = -1: -r above 0.8
    assert sg["clip"]["positive"] == pytest.approx([0.5, 0.8, 1.0, 1.2, 0, 0])
    assert sg["clip"]["negative"] == pytest.approx([0, -0.8, -1.0, -1.2, -1.5, -2.0])
    assert sg["cispo"]["positive"] == pytest.approx([0.5, 0.8, 1.0, 1.2, 1.5, 2.0])   # min(r, eps_max 5): none dropped
    assert sg["vespo"]["positive"][0] == pytest.approx(math.exp(1.5) / 4, abs=1e-5)   # e^(3 + 2 ln .5 - 3 x .5)
    assert all(sg[n]["positive"][2] == pytest.approx(1.0) for n in algos.SURROGATES)  # on-policy: every one is -A
