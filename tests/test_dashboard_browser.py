"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, through Selenium).

Without a browser these tests are skipped with the reason, except in CI (CI=true), where that is a failure.
Each page is saved as a PNG in $AHA_SCREENSHOTS (default: a temporary directory). With $AHA_DASHBOARD_ROOT the
pages show the runs under that directory instead of the small run these tests train.
"""

import math
import os
import shutil
import time
from pathlib import Path

import pytest
import torch

from aha import algos

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
PAGES = ("runs", "curves", "groups", "aha", "learn")
WAIT_S = 20
ROOT: dict = {}
"""The runs directory being served (set by the `site` fixture)."""


def digit_share(prompts, completions, **kw):
    """A graded reward, so that every group has advantages and every sequence is in the update."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def _need_browser():
    try:
        import selenium  # noqa: F401
        missing = [name for name, path in (("chromium", CHROMIUM), ("chromedriver", DRIVER)) if not path]
    except ImportError:
        missing = ["selenium (pip)"]
    if missing:
        why = f"no {', '.join(missing)}: apt-get install chromium chromium-driver; pip install selenium"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI needs the browser tests: {why}")
        pytest.skip(why)


@pytest.fixture(scope="module")
def site(tiny_dir, tmp_path_factory):
    """A short real GRPO run with group records, served on 127.0.0.1; yields the base URL."""
    _need_browser()
    from aha.config import DashboardConfig, GRPOConfig
    from aha.dashboard import build_app
    from aha.dashboard.server import Server
    from aha.train.grpo import GRPOTrainer
    tmp = tmp_path_factory.mktemp("dash")
    root = os.environ.get("AHA_DASHBOARD_ROOT")
    if not root:
        root = tmp / "runs"
        prompts = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
        args = GRPOConfig(output_dir=str(root / "tiny"), max_steps=4, num_generations=4, per_device_train_batch_size=8,
                          max_completion_length=8, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                          log_completions_steps=0, log_groups_steps=2, seed=0)
        GRPOTrainer(model=tiny_dir, reward_funcs=[digit_share], args=args, train_dataset=prompts).train()
        shutil.copytree(root / "tiny", root / "tiny_copy")  # a second run to overlay
    ROOT["path"] = Path(root)
    cfg = DashboardConfig(runs_root=str(root), playground_dir=str(tmp / "playground"), playground_max_steps=20)
    server = Server(build_app(cfg))
    yield server.start()
    server.stop()


@pytest.fixture(scope="module")
def driver(site):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(options=opts, service=Service(DRIVER))
    yield d
    d.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    path = Path(os.environ.get("AHA_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def wait_for(fn, timeout=WAIT_S, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def open_page(driver, site, name):
    driver.get(f"{site}/#{name}")
    driver.refresh()  # the same document with another hash: load it afresh so its console log is its own
    page = name.split("?")[0]
    wait_for(lambda: driver.execute_script("return document.body.dataset.ready") == page, what=f"page {name}")


def console_errors(driver):
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def test_every_page_loads_without_console_errors(driver, site, shots):
    for name in PAGES:
        open_page(driver, site, name)
        time.sleep(0.5)  # let the first poll and the Learn page's requests land
        assert not console_errors(driver), (name, console_errors(driver))
        assert "error:" not in driver.find_element("id", "view").text, name
        driver.save_screenshot(str(shots / f"{name}.png"))


def test_curves_are_drawn_one_series_per_run(driver, site):
    open_page(driver, site, "curves")
    charts = wait_for(lambda: driver.execute_script(
        "return window.ahaCharts.map(c => [c.key, c.plot.series.length - 1, c.plot.data[0].length])"), what="charts")
    keys = {k: (n, points) for k, n, points in charts}
    assert keys["reward/mean"] == (1, keys["reward/mean"][1]) and keys["reward/mean"][1] >= 2
    assert keys["reward+eval"][0] == 2 and "behaviour/reflection_rate" in keys
    painted = driver.execute_script("""
        const c = document.querySelector('.chart[data-key="reward/mean"] canvas');
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < px.length; i += 4) if (px[i]) n++; return n;""")
    assert painted > 100  # the canvas holds a drawn line and axes, not nothing


def test_a_reward_slider_shows_exactly_what_aha_algos_returns(driver, site):
    open_page(driver, site, "learn")
    driver.execute_script("const s = document.getElementById('s-r1'); s.value = 0.3;"
                          "s.dispatchEvent(new Event('input'));")
    rewards = torch.tensor([0.3, 0.0, 0.0, 1.0, 0.5, 0.0])
    for name in algos.ADVANTAGES:
        want = algos.compute_advantages(name, rewards, 6)[0].tolist()
        for i in (0, 3):
            cell = f'#adv-table td[data-est="{name}"][data-i="{i}"]'
            wait_for(lambda: driver.execute_script(f"const c = document.querySelector('{cell}'); return c && "
                                                   f"Math.abs(+c.textContent - {want[i]}) < 1e-4"),
                     what=f"{name} advantage {i} = {want[i]:.4f}")
            shown = driver.find_element("css selector", cell).get_attribute("data-value")
            assert float(shown) == round(want[i], 6)  # the server's number (6 decimals), not one the page made


def test_the_loss_explainer_shows_every_surrogate_beside_the_aggregations(driver, site):
    open_page(driver, site, "learn")
    for name in algos.SURROGATES:
        wait_for(lambda: driver.find_elements("css selector", f'#surrogate-table tr[data-surrogate="{name}"]'),
                 what=f"surrogate {name}")
    for name, kind in algos.LOSS_TYPES.items():
        row = driver.find_element("css selector", f'#loss-type-table tr[data-loss-type="{name}"]').text
        assert row.split() == [name, kind.surrogate, kind.aggregation]
    assert driver.find_elements("css selector", '#token-loss-table tr[data-loss="dapo"]')
    assert not console_errors(driver)


def test_clicking_a_token_shows_its_ratio(driver, site):
    open_page(driver, site, "groups")
    token = wait_for(lambda: driver.find_elements("css selector", ".tok.trained"), what="tokens")[0]
    token.click()
    detail = driver.find_element("id", "token-detail").text
    assert "ratio" in detail and "log-prob" in detail and "KL" in detail
    assert driver.find_element("css selector", "#token-detail .ratio").text.split("ratio ")[1] != "–"


def test_a_playground_run_streams_its_curve_and_can_be_cancelled(driver, site, shots):
    open_page(driver, site, "learn")
    steps = driver.find_element("id", "pg-max_steps")
    steps.clear()
    steps.send_keys("20")
    driver.find_element("id", "pg-start").click()
    status = driver.find_element("id", "pg-status")
    wait_for(lambda: int(status.get_attribute("data-steps") or 0) >= 3, timeout=120, what="3 playground steps")
    points = driver.execute_script("const c = window.ahaCharts.find(c => c.key === 'playground');"
                                   "return c ? c.plot.data[0].length : 0")
    assert points >= 3
    driver.execute_script("document.getElementById('playground').scrollIntoView()")
    driver.save_screenshot(str(shots / "playground.png"))
    driver.find_element("id", "pg-cancel").click()
    wait_for(lambda: status.get_attribute("data-state") == "cancelled", what="cancelled")
    assert not console_errors(driver)


def test_runs_ticked_together_are_overlaid(driver, site):
    if os.environ.get("AHA_DASHBOARD_ROOT"):
        pytest.skip("needs the two runs these tests write")
    open_page(driver, site, "runs")
    for box in driver.find_elements("css selector", "#runs-table input[type=checkbox]"):
        if box.is_selected() != (box.get_attribute("data-run") in ("tiny", "tiny_copy")):
            box.click()
    driver.find_element("id", "overlay").click()
    wait_for(lambda: driver.execute_script("return document.body.dataset.ready") == "curves", what="curves")
    charts = wait_for(lambda: driver.execute_script(
        "return window.ahaCharts.map(c => [c.key, c.plot.series.length - 1])"), what="charts")
    assert dict(charts)["reward/mean"] == 2 and dict(charts)["reward+eval"] == 4  # two runs, each its own series


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch):
    import sys
    monkeypatch.setattr(sys.modules[__name__], "CHROMIUM", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI needs the browser tests: no chromium"):
        _need_browser()
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="apt-get install chromium chromium-driver"):
        _need_browser()


def test_curves_follow_a_run_being_written_and_show_a_half_written_line(driver, site):
    if os.environ.get("AHA_DASHBOARD_ROOT"):
        pytest.skip("writes a run of its own into the served directory")
    import json
    run = ROOT["path"] / "live"
    run.mkdir()
    metrics = run / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "reward/mean": s / 10}) + "\n" for s in (1, 2)))
    open_page(driver, site, "curves?runs=live")
    points = lambda: driver.execute_script(  # noqa: E731
        "const c = window.ahaCharts.find(c => c.key === 'reward/mean'); return c ? c.plot.data[0].length : 0")
    wait_for(lambda: points() == 2, what="2 points")
    with open(metrics, "a") as f:
        f.write('{"step": 3, "reward/me')  # the writer is mid-line
    wait_for(lambda: driver.find_elements("css selector", ".partial-line"), what="the partial line shown")
    with open(metrics, "a") as f:
        f.write('an": 0.3}\n')
    wait_for(lambda: points() == 3 and not driver.find_elements("css selector", ".partial-line"), what="3 points")
    assert not console_errors(driver)


# ---------------------------------------------------------------- a dashboard a user keeps open
def _own_runs():
    if os.environ.get("AHA_DASHBOARD_ROOT"):
        pytest.skip("writes runs of its own")


def _write_run(path, rows=None, groups=None, held_out=None, config="model: tiny\nnum_generations: 2\n"):
    import json
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(config)
    for name, lines in (("metrics.jsonl", rows), ("groups.jsonl", groups), ("held_out.jsonl", held_out)):
        if lines is not None:
            (path / name).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def _js_wait(driver, script, what, timeout=WAIT_S):
    return wait_for(lambda: driver.execute_script(script), timeout=timeout, what=what)


def _chart(driver, key):
    return driver.execute_script("const c = window.ahaCharts.find(c => c.key === arguments[0]); return c ? "
                                 "{series: c.plot.series.map(s => s.label), data: c.plot.data, "
                                 "y: [c.plot.scales.y.min, c.plot.scales.y.max], "
                                 "strokes: c.plot.series.map(s => typeof s.stroke === 'function' ? "
                                 "s.stroke(c.plot, 1) : s.stroke)}"
                                 " : null", key)


def test_a_folder_given_by_name_shows_the_runs_nested_in_it(driver, tmp_path):
    """`aha dashboard runs/demo`: the demo's folder holds base (a model), sft and grpo; each run is listed and usable."""
    _own_runs()
    from aha.config import DashboardConfig
    from aha.dashboard import build_app
    from aha.dashboard.server import Server
    demo = tmp_path / "runs" / "demo"
    shutil.copytree(ROOT["path"] / "tiny", demo / "grpo")
    _write_run(demo / "sft", [{"step": s, "loss": 2.0 / s} for s in range(1, 6)], config="learning_rate: 0.003\n")
    (demo / "base").mkdir()
    (demo / "base" / "config.json").write_text("{}")
    (demo / "demo_config.yaml").write_text("grpo_steps: 4\n")
    cfg = DashboardConfig(runs=[str(demo), str(tmp_path / "runs" / "typo")], playground_dir=str(tmp_path / "pg"))
    server = Server(build_app(cfg))
    url = server.start()
    try:
        open_page(driver, url, "runs")
        rows = {r.get_attribute("data-run"): r for r in driver.find_elements("css selector", "#runs-table tr[data-run]")}
        assert {"demo/grpo", "demo/sft"} <= set(rows) and "demo/base" not in rows
        steps = int(rows["demo/grpo"].find_elements("tag name", "td")[2].text)
        assert steps == 4 and "grpo" in rows["demo/grpo"].text and "sft" in rows["demo/sft"].text
        assert "typo" in driver.find_element("css selector", ".empty-folder").text  # a folder with no run says so
        open_page(driver, url, "curves")
        assert "demo/grpo" in driver.find_element("tag name", "h2").text
        _js_wait(driver, "return window.ahaCharts.some(c => c.key === 'reward/mean' && c.plot.data[0].length === 4)",
                 "demo/grpo's curves")
        open_page(driver, url, "groups")
        assert driver.find_element("id", "run-select").get_attribute("value") == "demo/grpo"
        wait_for(lambda: driver.find_elements("css selector", ".group"), what="demo/grpo's groups")
        open_page(driver, url, "aha")
        options = [o.text for o in driver.find_elements("css selector", "#run-select option")]
        assert options == ["demo/grpo", "demo/sft"]
        assert not console_errors(driver)
    finally:
        server.stop()


def test_a_metric_is_found_by_search_smoothed_zoomed_and_enlarged(driver, site, shots):
    open_page(driver, site, "curves" if os.environ.get("AHA_DASHBOARD_ROOT") else "curves?runs=tiny")
    _js_wait(driver, "return window.ahaCharts.some(c => c.key === 'completion/len_mean')", "charts")
    box = driver.find_element("id", "curve-search")
    box.send_keys("len_mean")
    _js_wait(driver, "return window.ahaCharts.length > 0 && window.ahaCharts.every(c => c.key.includes('len_mean'))",
             "only the metrics that match")
    driver.execute_script("const s = document.getElementById('curve-smooth'); s.value = 0.8; s.dispatchEvent(new Event('input'));")
    _js_wait(driver, "const c = window.ahaCharts.find(c => c.key === 'completion/len_mean'); return c && c.plot.series.length === 3",
             "a raw and a smoothed series")
    got = _chart(driver, "completion/len_mean")
    raw, smooth = got["data"][1], got["data"][2]
    last, n, want = 0.0, 0, []
    for v in raw:  # TensorBoard's debiased exponential moving average; a row without the metric stays empty
        if v is None:
            want.append(None)
            continue
        last, n = last * 0.8 + 0.2 * v, n + 1
        want.append(last / (1 - 0.8 ** n))
    assert [v is None for v in smooth] == [v is None for v in want] and sum(v is not None for v in want) >= 3
    assert [v for v in smooth if v is not None] == pytest.approx([v for v in want if v is not None], rel=1e-9)
    assert "smoothed" in got["series"][2]
    assert "q=len_mean" in driver.current_url and "smooth=0.8" in driver.current_url  # the view is in the address
    driver.save_screenshot(str(shots / "curves_search.png"))
    driver.refresh()
    _js_wait(driver, "return document.body.dataset.ready === 'curves' && window.ahaCharts.length > 0", "reloaded")
    assert driver.find_element("id", "curve-search").get_attribute("value") == "len_mean"
    box = driver.find_element("id", "curve-search")
    box.clear()
    box.send_keys("completion/len")
    _js_wait(driver, "return window.ahaCharts.length >= 2 && window.ahaCharts.every(c => c.key.includes('completion/len'))",
             "completion/len_mean, _min, _max")
    keys = driver.execute_script("return window.ahaCharts.map(c => c.key)")  # zoom one chart: the others follow
    driver.execute_script("window.ahaCharts[0].plot.setScale('x', {min: 2, max: 3})")
    assert driver.execute_script("return window.ahaCharts[1].plot.scales.x.min") == 2
    driver.find_element("css selector", f'.chart[data-key="{keys[0]}"] button.enlarge').click()
    big = _js_wait(driver, "const z = document.querySelector('#chart-zoom canvas'); return z && z.width", "the enlarged chart")
    assert big > 2 * driver.execute_script(f"return document.querySelector('.chart[data-key=\"{keys[0]}\"] canvas').width")
    driver.find_element("tag name", "body").send_keys("\ue00c")  # Escape
    wait_for(lambda: not driver.find_elements("id", "chart-zoom"), what="closed")
    assert not console_errors(driver)


def test_a_flat_series_gets_an_axis_around_its_value_and_an_empty_one_no_frame(driver, site):
    _own_runs()
    rows = [{"step": s, "flat/zero": 0.0, "flat/level": 0.3, "varies": s / 10, "never": None} for s in range(1, 11)]
    _write_run(ROOT["path"] / "x_flat", rows)
    open_page(driver, site, "curves?runs=x_flat")
    _js_wait(driver, "return window.ahaCharts.some(c => c.key === 'flat/zero')", "charts")
    lo, hi = _chart(driver, "flat/zero")["y"]
    assert lo < 0 < hi and hi - lo <= 2  # not 0-100
    lo, hi = _chart(driver, "flat/level")["y"]
    assert lo < 0.3 < hi and hi - lo <= 0.5
    assert "constant 0.3" in driver.find_element("css selector", '.chart[data-key="flat/level"]').text
    assert _chart(driver, "never") is None  # no blank frame for a series with no values
    assert "never" in driver.find_element("id", "empty-series").text


def test_a_series_whose_spread_is_far_below_its_values_is_drawn(driver, site):
    """uPlot rounds the range of 1 .. 1.0000001 (an importance ratio's mean) to zero width and throws while drawing."""
    _own_runs()
    rows = [{"step": s, "ratio": 1.0 + (1.1920929e-07 if s == 3 else 0.0)} for s in range(1, 6)]
    _write_run(ROOT["path"] / "x_nearflat", rows)
    open_page(driver, site, "curves?runs=x_nearflat")
    _js_wait(driver, "return window.ahaCharts.some(c => c.key === 'ratio')", "the chart")
    time.sleep(0.5)
    lo, hi = _chart(driver, "ratio")["y"]
    assert lo < 1.0 < 1.0000001 < hi
    assert not console_errors(driver)


def test_curves_export_a_csv_and_show_the_overlaid_runs_config_differences(driver, site, tmp_path):
    _own_runs()
    other = ROOT["path"] / "x_lr"
    shutil.copytree(ROOT["path"] / "tiny", other)
    import yaml
    cfg = yaml.safe_load((other / "config.yaml").read_text())
    assert cfg["learning_rate"] == 0.01
    (other / "config.yaml").write_text(yaml.safe_dump({**cfg, "learning_rate": 0.005, "output_dir": str(other)}))
    driver.execute_cdp_cmd("Page.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(tmp_path)})
    open_page(driver, site, "curves?runs=tiny,x_lr&q=reward/mean")
    row = wait_for(lambda: driver.find_elements("css selector", '#config-diff-table tr[data-key="learning_rate"]'),
                   what="the config diff")[0]
    assert "0.01" in row.text and "0.005" in row.text
    assert not driver.find_elements("css selector", '#config-diff-table tr[data-key="output_dir"]')
    assert not driver.find_elements("css selector", '#config-diff-table tr[data-key="seed"]')  # equal: not listed
    _js_wait(driver, "return window.ahaCharts.some(c => c.key === 'reward/mean')", "charts")
    driver.find_element("id", "curve-csv").click()
    files = wait_for(lambda: [p for p in tmp_path.glob("*.csv")], what="the CSV download")
    lines = files[0].read_text().splitlines()
    assert lines[0].split(",") == ["step", "tiny:reward/mean", "x_lr:reward/mean"]
    import json
    want = [json.loads(x) for x in (ROOT["path"] / "tiny" / "metrics.jsonl").read_text().splitlines()]
    assert [float(v.split(",")[1]) for v in lines[1:]] == pytest.approx([r["reward/mean"] for r in want])


def _colour_run():
    big = [0.93, -0.93]
    small = [0.0012, -0.0012]

    def completion(a, ratio):
        n = len(ratio)
        return {"text": "x" * n, "rewards": [1.0 if a > 0 else 0.0], "reward": 1.0 if a > 0 else 0.0, "advantage": a,
                "trained": True, "tokens": {"piece": [f"t{i}" for i in range(n)], "logp": [-0.1 * (i + 1) for i in range(n)],
                                            "ratio": ratio, "clip": [1 if r > 1.2 and a > 0 else 0 for r in ratio],
                                            "kl": None, "loss": [-a * r / 8 for r in ratio]}}

    def group(g, advs, ratios):
        return {"step": 1, "group": g, "prompt": [{"role": "user", "content": f"question {g}"}], "answer": "1",
                "reward_names": ["math"], "mean": 0.5, "std": 0.7, "completions": [completion(a, r) for a, r in zip(advs, ratios)]}
    return [group(0, big, [[1.0, 1.3, 0.7, 1.0], [1.0, 1.0]]), group(1, small, [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])]


def _alphas(driver, group):
    return driver.execute_script(
        "return [...document.querySelectorAll('.group')[arguments[0]].querySelectorAll('.tok')].map(s => {"
        "const m = getComputedStyle(s).backgroundColor.match(/rgba?\\(([^)]*)\\)/); const p = m[1].split(',').map(Number);"
        "return p.length === 4 ? p[3] : 1; })", group)


def test_groups_colours_share_one_scale_across_the_step_and_show_per_token_differences(driver, site):
    _own_runs()
    _write_run(ROOT["path"] / "x_colours", [{"step": 1, "reward/mean": 0.5}], groups=_colour_run())
    open_page(driver, site, "groups?run=x_colours&step=1")
    wait_for(lambda: len(driver.find_elements("css selector", ".group")) == 2, what="two groups")
    big, small = _alphas(driver, 0), _alphas(driver, 1)
    assert max(big) > 0.9 and max(small) < 0.01  # -0.0012 is pale beside ±0.93, not as dark
    assert "% of the step's largest" in driver.find_element("css selector", ".group[data-group='1'] .group-scale").text
    assert "step 1" in driver.find_element("id", "colour-legend").text
    Select = __import__("selenium.webdriver.support.select", fromlist=["Select"]).Select
    Select(driver.find_element("id", "colour-by")).select_by_value("ratio")
    first = driver.find_elements("css selector", ".group[data-group='0'] .completion")[0]
    colours = {s.value_of_css_property("background-color") for s in first.find_elements("css selector", ".tok")}
    assert len(colours) == 3  # ratios 1.0, 1.3, 0.7: three colours within one answer
    assert first.find_elements("css selector", ".tok.clip-high")  # the clipped token is marked
    Select(driver.find_element("id", "colour-by")).select_by_value("surprise")
    first = driver.find_elements("css selector", ".group[data-group='0'] .completion")[0]
    assert len({s.value_of_css_property("background-color") for s in first.find_elements("css selector", ".tok")}) == 4
    assert not console_errors(driver)


def test_the_aha_tracker_shows_questions_keeps_long_answers_in_their_cells_and_one_meaning_per_colour(driver, site):
    _own_runs()
    prompt = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 17+25?<|im_end|>\n<|im_start|>assistant\n"
    held = [{"step": s, "id": 0, "prompt": prompt, "answer": "42", "greedy": g, "correct": g == "42"}
            for s, g in ((0, "4" * 3000), (10, "42"))]
    rows = [{"step": s, "behaviour/reflection_rate": 0.1 * s, "behaviour/reflection_rate/correct": 0.2,
             "behaviour/reflection_rate/incorrect": 0.05, "behaviour/len_correct": 10 + s, "behaviour/len_incorrect": 30 - s}
            for s in range(1, 6)]
    _write_run(ROOT["path"] / "x_aha", rows, held_out=held)
    open_page(driver, site, "aha?run=x_aha")
    cell = wait_for(lambda: driver.find_elements("css selector", "#held-out-table tr:last-child td"), what="the held-out table")[0]
    assert "What is 17+25?" in cell.text and "<|im_start|>" not in cell.text and "system" not in cell.text
    for td in driver.find_elements("css selector", "#held-out-table td"):
        inside = driver.execute_script("const r = arguments[0].getBoundingClientRect(); "
                                       "return arguments[0].scrollWidth <= arguments[0].clientWidth + 1 && r.height < 160 "
                                       "&& r.right <= document.documentElement.clientWidth + 1", td)
        assert inside, td.text[:40]
    colour = {}
    for key in ("reflection", "lengths"):
        got = _chart(driver, key)
        colour[key] = {label: stroke for label, stroke in zip(got["series"], got["strokes"]) if label in ("correct", "incorrect")}
    assert colour["reflection"] == colour["lengths"] and colour["reflection"]["correct"] != colour["reflection"]["incorrect"]
    green = colour["reflection"]["correct"].lstrip("#")
    r, g = int(green[:2], 16), int(green[2:4], 16)
    assert g > r  # correct is green, as the held-out table's right answers
    assert not console_errors(driver)


def test_the_playground_error_stays_five_seconds_or_until_dismissed_and_runs_link_to_groups(driver, site):
    open_page(driver, site, "learn")
    steps = driver.find_element("id", "pg-max_steps")
    steps.clear()
    steps.send_keys("999")
    driver.find_element("id", "pg-start").click()
    error = driver.find_element("id", "pg-error")
    wait_for(lambda: error.is_displayed(), what="the error")
    assert "max_steps must be a number in [1, 20]" in error.text
    time.sleep(2.5)  # two status polls later
    assert error.is_displayed() and "max_steps" in error.text
    driver.find_element("id", "pg-error-dismiss").click()
    assert not error.is_displayed()
    driver.find_element("id", "pg-start").click()
    wait_for(lambda: error.is_displayed(), what="the error again")
    time.sleep(5.5)
    assert not error.is_displayed()  # gone by itself after 5 s
    steps.clear()
    steps.send_keys("20")
    driver.find_element("id", "pg-start").click()
    status = driver.find_element("id", "pg-status")
    wait_for(lambda: status.get_attribute("data-state") == "running", what="a running playground job")
    driver.find_element("id", "pg-start").click()  # while it runs
    wait_for(lambda: error.is_displayed() and "already going" in error.text, what="'already going'")
    run = status.get_attribute("textContent").split(":")[0]
    links = "return [...document.querySelectorAll(arguments[0])].map(a => a.getAttribute('href'))"  # read at once: redrawn each poll
    hrefs = wait_for(lambda: driver.execute_script(links, "#pg-status a"), what="links to its groups and curves")
    assert hrefs == [f"#groups?run={run.replace('/', '%2F')}", f"#curves?runs={run.replace('/', '%2F')}"]
    driver.find_element("id", "pg-cancel").click()
    wait_for(lambda: status.get_attribute("data-state") == "cancelled", what="cancelled")
    assert wait_for(lambda: driver.execute_script(links, f'#pg-runs tr[data-run="{run}"] a'), what="the runs table") == hrefs[::-1]
    refused = "/api/playground/start - Failed to load resource: the server responded with a status of 400"
    assert not [e for e in console_errors(driver) if refused not in e["message"]]  # the 400s are the refusals shown


def _shown_numbers(driver, panel):
    return [float(v) for v in driver.execute_script(
        f"return [...document.querySelectorAll('#{panel} .num')].map(e => e.dataset.value).filter(v => v !== 'null')")]


def _numbers(obj):
    """Every number in a JSON answer, rounded as the server rounds them."""
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _numbers(v)]
    if isinstance(obj, list):
        return [x for v in obj for x in _numbers(v)]
    return [round(float(obj), 6)] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def test_learn_advantages_take_any_rewards_explain_each_estimator_and_give_equal_rewards_zero(driver, site):
    open_page(driver, site, "learn")
    driver.find_element("id", "adv-equal").click()  # [1.6] * 8
    cells = lambda: driver.execute_script(  # noqa: E731  (read at once: the table is redrawn as answers come)
        "return [...document.querySelectorAll('#adv-table td[data-est]')].map(c => [c.dataset.est, +c.dataset.i, "
        "c.dataset.value, c.textContent])")
    wait_for(lambda: len(cells()) == 8 * len(algos.ADVANTAGES), what="8 answers")
    assert {(c[2], c[3]) for c in cells()} == {("0", "0")}
    box = driver.find_element("id", "adv-rewards")
    box.clear()
    box.send_keys("-1, 2.5, 0.5, 3")
    rewards = torch.tensor([-1.0, 2.5, 0.5, 3.0])
    wait_for(lambda: len(cells()) == 4 * len(algos.ADVANTAGES), what="4 answers")
    shown = {(est, i): float(v) for est, i, v, _ in cells()}
    for name in algos.ADVANTAGES:
        want = [round(v, 6) for v in algos.compute_advantages(name, rewards, 4)[0].tolist()]
        assert [shown[name, i] for i in range(4)] == pytest.approx(want, abs=1e-6), name
    about = driver.find_element("id", "adv-about").text
    for name in ("batch", "batch_rewards", "dr_grpo", "rloo", "grpo"):
        assert f"{name} A_i =" in about  # a formula and a line of explanation for every column
    assert "leave-one-out" in about and "scale_rewards" in about
    other = driver.find_element("id", "adv-other")
    other.send_keys("0, 0, 0, 1")  # a second group in the batch: the batch-wide estimators change
    from aha.dashboard import explain
    want = explain.advantages({"rewards": [-1, 2.5, 0.5, 3], "other": [0, 0, 0, 1]})["advantages"]["batch"]
    wait_for(lambda: [float(v) for est, i, v, _ in sorted(cells(), key=lambda c: c[1]) if est == "batch"] == want,
             what="batch with two groups")


def _shoot(driver, shots, element_id, name):
    driver.execute_script("document.getElementById(arguments[0]).scrollIntoView()", element_id)
    time.sleep(0.3)
    driver.save_screenshot(str(shots / name))


def test_the_ratio_curve_shades_the_clip_region_and_marks_the_ratio_and_kl_has_the_true_kl(driver, site, shots):
    open_page(driver, site, "learn")
    _js_wait(driver, "return window.ahaCharts.some(c => c.key === 'ratio-curve')", "the ratio curve")
    shade = driver.execute_script("""
        const c = window.ahaCharts.find(c => c.key === 'ratio-curve').plot;
        const px = (x, y) => Array.from(c.ctx.getImageData(c.valToPos(x, 'x', true), c.valToPos(y, 'y', true), 1, 1).data);
        return {inside: px(1.05, 0.37), outside: px(2.2, 0.37), marker: px(1.4, 0.37)};""")
    r, g, b, a = shade["inside"]
    assert a > 0 and r > b + 30 and g > b + 20  # the clip region [0.8, 1.28] is shaded (yellow)
    assert shade["outside"][3] == 0 or shade["outside"][:3] == [255, 255, 255]  # nothing outside it
    assert shade["marker"][3] > 0 and max(shade["marker"][:3]) < 90  # the dashed line at the current ratio 1.4
    p, q = 0.3, 0.5
    true_kl = p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
    cell = wait_for(lambda: driver.find_elements("id", "kl-true"), what="the true KL")[0]
    assert float(cell.get_attribute("data-value")) == pytest.approx(true_kl, abs=1e-6)
    assert "{π, 1−π}" in driver.find_element("id", "kl-statement").text
    lo, hi = _chart(driver, "kl-curve")["y"]
    assert hi <= 10 and lo >= -10  # k3's spike (45 at π = 0.01) does not set the axis
    assert "true KL" in _chart(driver, "kl-curve")["series"]
    _shoot(driver, shots, "ratio-panel", "learn_ratio.png")
    _shoot(driver, shots, "kl-panel", "learn_kl.png")


def test_token_level_loss_weights_are_aha_algos_aggregate(driver, site, shots):
    open_page(driver, site, "learn")
    for name, value in (("short", 3), ("long", 12)):
        driver.execute_script(f"const s = document.getElementById('s-{name}'); s.value = {value};"
                              "s.dispatchEvent(new Event('input'));")
    bars = lambda t, w: [float(v) for v in driver.execute_script(  # noqa: E731
        f"return [...document.querySelectorAll('#token-loss-table tr[data-loss=\"{t}\"] .bars.{w} .bar')].map(b => b.dataset.value)")]
    wait_for(lambda: len(bars("grpo", "short")) == 3 and len(bars("grpo", "long")) == 12, what="3 and 12 tokens")
    mask = torch.zeros(2, 12)
    mask[0, :3], mask[1, :] = 1, 1
    for loss_type in algos.AGGREGATIONS:
        w = torch.ones(2, 12, requires_grad=True)
        (grad,) = torch.autograd.grad(algos.aggregate(loss_type, w, mask, max_len=32), w)
        assert bars(loss_type, "short") == pytest.approx(grad[0, :3].tolist(), abs=1e-6)
        assert bars(loss_type, "long") == pytest.approx(grad[1].tolist(), abs=1e-6)
    assert bars("grpo", "short")[0] == pytest.approx(1 / 6, abs=1e-6) and bars("dapo", "long")[0] == pytest.approx(1 / 15, abs=1e-6)
    assert bars("dr_grpo", "short")[0] == pytest.approx(1 / 64, abs=1e-6)
    heights = driver.execute_script("return [...document.querySelectorAll('#token-loss-table tr[data-loss=\"grpo\"] .bar')]"
                                    ".map(b => b.getBoundingClientRect().height)")
    assert heights[0] > heights[-1]  # grpo: a short answer's tokens weigh more each
    _shoot(driver, shots, "token-loss-panel", "learn_token_loss.png")


def test_the_toy_grpo_update_is_aha_own_update_step_after_step(driver, site, shots):
    from aha.dashboard import toy
    open_page(driver, site, "learn")
    driver.execute_script("const s = document.getElementById('s-toy-r6'); s.value = 2; s.dispatchEvent(new Event('input'));")
    rewards = [1, 1, 0, 0.5, 0, 2]
    after = lambda: driver.execute_script(  # noqa: E731
        "return [...document.querySelectorAll('#toy-table td.after')].map(c => c.dataset.value)")
    body = {"rewards": rewards, "learning_rate": 0.1, "epsilon": 0.2, "beta": 0, "passes": 1, "estimator": "grpo",
            "loss_type": "dapo"}
    first = toy.update({**body, "state": None})
    driver.find_element("id", "toy-step").click()
    wait_for(lambda: after() and float(after()[0]) == first["after"][0], timeout=60, what="the first update")
    assert [float(v) for v in after()] == first["after"]
    second = toy.update({**body, "state": first["state"]})
    driver.find_element("id", "toy-step").click()
    wait_for(lambda: [float(v) for v in after()] == second["after"], what="the second update, from the first's state")
    before = [float(v) for v in driver.execute_script(
        "return [...document.querySelectorAll('#toy-table td.before')].map(c => c.dataset.value)")]
    assert before == first["after"] and second["after"][5] > first["after"][5] > first["before"][5]  # reward 2 rises
    assert "2 update(s)" in driver.find_element("id", "toy-updates").text
    assert len(_chart(driver, "toy-history")["data"][0]) == 3  # the start and two updates
    driver.find_element("id", "toy-step10").click()
    wait_for(lambda: len(_chart(driver, "toy-history")["data"][0]) == 13, what="ten more updates")
    _shoot(driver, shots, "toy-panel", "learn_toy_update.png")


def test_every_learn_number_is_computed_by_aha_algos_on_the_server(driver, site):
    from aha.dashboard import explain, supervision, toy
    open_page(driver, site, "learn")
    driver.find_element("id", "toy-step").click()
    wait_for(lambda: driver.find_elements("css selector", "#toy-table td.after"), timeout=60, what="a toy update")
    answers = {"adv-panel": explain.advantages({"rewards": [1, 0, 0, 1, 0.5, 0]}),
               "token-loss-panel": explain.aggregation({"short": 4, "long": 16, "max_len": 32}),
               "ratio-panel": explain.ratio({"p_old": 0.5, "p_new": 0.7, "epsilon": 0.2, "epsilon_high": 0.28}),
               "kl-panel": explain.kl({"p": 0.3, "p_ref": 0.5}), "process-panel": supervision.outcome_vs_process({}),
               "toy-panel": toy.update({"rewards": [1, 1, 0, 0.5, 0, 0], "learning_rate": 0.1, "epsilon": 0.2, "beta": 0,
                                        "passes": 1, "estimator": "grpo", "loss_type": "dapo"})}
    for panel, answer in answers.items():
        shown, known = _shown_numbers(driver, panel), _numbers(answer)
        assert len(shown) >= 5, panel
        for v in shown:
            assert any(abs(v - k) < 1e-9 for k in known), (panel, v)  # shown exactly as the server computed it


def _process_rows(driver, kind):
    """Every answer's per-token advantages, answer after answer, as the Learn page shows them (`kind`: outcome or
    process)."""
    return [float(v) for v in driver.execute_script(
        "return [...document.querySelectorAll('#process-out table.process-answer')].flatMap(t => "
        f"[...t.querySelectorAll('tr.{kind} td')].map(c => c.dataset.value))")]


def _process_by_algos(steps, outcomes):
    """The explainer's example by aha.algos: 4 answers, steps on tokens 1, 2, 3, the outcome on token 6 of 7."""
    outcome = torch.tensor(outcomes, dtype=torch.float32)             # [N=4]
    score = torch.tensor([s for st in steps for s in st], dtype=torch.float32)  # [S=12]
    process, _ = algos.process_advantages(outcome, torch.full((4,), 6), torch.arange(4).repeat_interleave(3),
                                          torch.tensor([1, 2, 3] * 4), score, 7, 4)  # [N,T]
    pool = torch.cat([outcome, score])                                # [16] the group's steps and outcomes
    return process, algos.compute_advantages("grpo", outcome, 4)[0], algos.compute_advantages("grpo", pool, 16)[0]


def test_learn_process_supervision_click_a_step_see_aha_algos_advantages_and_toggle_it(driver, site, shots):
    open_page(driver, site, "learn")
    mark = '#process-out table[data-i="1"] .step-mark[data-j="1"]'  # answer 2's middle step: a dropped carry
    wait_for(lambda: driver.find_elements("css selector", mark), what="the process explainer")
    steps, outcomes = [[1, 1, 1], [1, 0, 1], [1, 1, 1], [1, 0, 0]], [1, 1, 0, 0]
    process, per_answer, norm = _process_by_algos(steps, outcomes)
    assert _process_rows(driver, "process") == pytest.approx(process.reshape(-1).tolist(), abs=1e-6)
    assert _process_rows(driver, "outcome") == pytest.approx(per_answer.repeat_interleave(7).tolist(), abs=1e-6)
    driver.execute_script("document.querySelector(arguments[0]).scrollIntoView({block: 'center'})", mark)
    driver.find_element("css selector", mark).click()
    value = lambda i: float(driver.find_element("id", i).get_attribute("data-value"))  # noqa: E731
    assert value("process-score") == 0 and value("process-normalised") == pytest.approx(float(norm[4 + 4]), abs=1e-6)
    assert value("process-outcome-adv") == pytest.approx(float(per_answer[1]), abs=1e-6)
    covered = driver.execute_script("return [...document.querySelectorAll('#process-out table[data-i=\"1\"] tr.process "
                                    "td.covered')].map(c => +c.dataset.t)")
    assert covered == [0, 1, 2] and not driver.find_elements("css selector", '#process-out table[data-i="0"] .covered, '
                                                              '#process-out tr.outcome .covered')
    assert "at or before the step's end" in driver.find_element("id", "process-detail").text
    _shoot(driver, shots, "process-panel", "learn_process.png")
    driver.find_element("id", "process-toggle").click()  # mark the step right: recomputed on the server
    steps[1][1] = 1
    process, _, norm = _process_by_algos(steps, outcomes)
    wait_for(lambda: _process_rows(driver, "process") == pytest.approx(process.reshape(-1).tolist(), abs=1e-6),
             what="recomputed")
    wait_for(lambda: value("process-score") == 1, what="the picked step, now right")
    assert value("process-normalised") == pytest.approx(float(norm[8]), abs=1e-6)
    assert "mark it wrong" in driver.find_element("id", "process-toggle").text
    assert not console_errors(driver)


def _step_run():
    """A step of process supervision: answer 1 has two column steps (right, then wrong) and per-token advantages;
    answer 2 was scored without steps and shares one advantage."""
    pieces = ["<think>", "7+5=12", " 4+8=12", "</think>", "<answer>322</answer>"]
    adv = [0.4, 0.4, -0.9, -0.3, -0.3]
    steps = [{"end": 13, "token": 1, "reward": "column_step_rewards", "score": 1.0},
             {"end": 20, "token": 2, "reward": "column_step_rewards", "score": 0.0}]
    tok = lambda n, a: {"piece": pieces[:n], "logp": [-0.5] * n, "ratio": [1.0] * n, "clip": [0] * n, "kl": None,  # noqa: E731
                        "loss": [-x / n for x in a]}
    first = {"text": "".join(pieces), "rewards": [0.0], "reward": 0.0, "advantage": 0.4, "trained": True, "steps": steps,
             "tokens": {**tok(5, adv), "advantage": adv}}
    second = {"text": "".join(pieces), "rewards": [1.0], "reward": 1.0, "advantage": 0.7, "trained": True,
              "tokens": tok(5, [0.7] * 5)}
    return [{"step": 1, "group": 0, "prompt": [{"role": "user", "content": "47+385"}], "answer": "432",
             "reward_names": ["math"], "mean": 0.5, "std": 0.7, "completions": [first, second]}]


def test_groups_show_step_rewards_on_their_steps_and_each_tokens_advantage(driver, site, shots):
    _own_runs()
    _write_run(ROOT["path"] / "x_steps", [{"step": 1, "reward/mean": 0.5}], groups=_step_run())
    open_page(driver, site, "groups?run=x_steps&step=1")
    answers = wait_for(lambda: driver.find_elements("css selector", ".completion"), what="two answers")
    plain, stepped = answers  # best first: the answer without steps (reward 1) leads
    marks = stepped.find_elements("css selector", ".step-score")
    assert [m.text for m in marks] == ["1", "0"] and [m.get_attribute("data-score") for m in marks] == ["1", "0"]
    order = driver.execute_script("return [...arguments[0].querySelectorAll('.tok, .step-score')].map(e => "
                                  "e.classList.contains('tok') ? e.textContent : '|' + e.textContent)", stepped)
    assert order == ["<think>", "7+5=12", "|1", " 4+8=12", "|0", "</think>", "<answer>322</answer>"]  # after each step's end
    tokens = stepped.find_elements("css selector", ".tok")
    assert [float(t.get_attribute("data-advantage")) for t in tokens] == [0.4, 0.4, -0.9, -0.3, -0.3]
    assert "advantage -0.9" in tokens[2].get_attribute("title") and "scored 0 by column_step_rewards" in tokens[2].get_attribute("title")
    underline = [t.value_of_css_property("border-bottom-color") for t in tokens]
    assert underline[0] == underline[1] == "rgba(22, 163, 74, 1)" and underline[2] == "rgba(220, 38, 38, 1)"  # step 1 right, step 2 wrong
    assert tokens[3].value_of_css_property("border-bottom-style") == "none"  # after the last step: no step
    assert "step rewards" in driver.find_element("id", "step-legend").text
    assert not plain.find_elements("css selector", ".step-score, .tok[title], .tok[data-advantage]")  # as before
    assert {t.value_of_css_property("border-bottom-style") for t in plain.find_elements("css selector", ".tok")} == {"none"}
    Select = __import__("selenium.webdriver.support.select", fromlist=["Select"]).Select
    Select(driver.find_element("id", "colour-by")).select_by_value("advantage")
    stepped = driver.find_elements("css selector", ".completion")[1]
    colours = [t.value_of_css_property("background-color") for t in stepped.find_elements("css selector", ".tok")]
    assert len(set(colours)) == 3 and colours[0] == colours[1] != colours[2]  # 0.4, 0.4, -0.9, -0.3, -0.3
    stepped.find_elements("css selector", ".tok")[2].click()
    assert "advantage -0.9" in driver.find_element("id", "token-detail").text
    driver.save_screenshot(str(shots / "groups_steps.png"))
    assert not console_errors(driver)


# ---------------------------------------------------------------- an agent's episodes; the aha moment
def _list_then_read(context):
    """Sample 0 lists the top folder, then reads a file that is not there (a tool that raises), then answers; sample 1
    lists "tmp" and answers: episodes of different lengths, so their rewards differ and both are trained."""
    calls = context.count("<|im_start|>tool")
    if calls == 0:
        path = "tmp" if "[sample 1]" in context else "."
        return f'<tool_call>\n{{"name": "list_dir", "arguments": {{"path": "{path}"}}}}\n</tool_call>'
    if calls == 1 and '"path": "."' in context:
        return '<tool_call>\n{"name": "read_file", "arguments": {"path": "missing.txt"}}\n</tool_call>'
    return "done"


def _agent_run(tiny_dir, path):
    """One GRPO step of the tiny model on two filesystem tasks, its turns scripted (tests/scripted.py): a real
    groups.jsonl of multi-turn episodes in about a second."""
    from aha import GRPOConfig, GRPOTrainer
    from aha.envs.filesystem import FilesystemEnv, make_tasks
    from scripted import ScriptedAgentEngine
    rows = [{"prompt": r["prompt"], "fs": r["fs"]} for r in make_tasks("train", 2, seed=0)]
    args = GRPOConfig(output_dir=str(path), max_steps=1, num_generations=2, per_device_train_batch_size=4,
                      max_completion_length=512, learning_rate=1e-2, progress_bar=False, report_to=["jsonl"],
                      log_completions_steps=0, log_groups_steps=1, seed=0)
    turns = lambda completions, **kw: [float(len(c)) for c in completions]  # noqa: E731  (messages per episode)
    GRPOTrainer(model=tiny_dir, reward_funcs=[turns], train_dataset=rows, environment_factory=FilesystemEnv, args=args,
                engine_factory=lambda m, tk, b: ScriptedAgentEngine(m, tk, b, script=_list_then_read)).train()
    import json
    return [json.loads(line) for line in (path / "groups.jsonl").read_text().splitlines()]


def test_groups_show_an_agents_episode_turn_by_turn_with_its_tool_tokens_read_not_trained(driver, site, tiny_dir):
    _own_runs()
    groups = _agent_run(tiny_dir, ROOT["path"] / "x_agent")
    open_page(driver, site, "groups?run=x_agent&step=1")
    wait_for(lambda: len(driver.find_elements("css selector", ".group")) == 2, what="two groups")
    first = driver.find_elements("css selector", ".group[data-group='0'] .completion")[0]  # best first: two calls
    heads = [h.text for h in first.find_elements("css selector", ".turn .turn-head")]
    assert len(heads) == 5 and 'list_dir({"path":"."})' in heads[0] and "read_file" in heads[2]
    assert "list_dir → ok" in heads[1] and "read_file → raised" in heads[3] and "no file missing.txt" in heads[3]
    assert "no tool call" in heads[4] and "finish stop" in first.text
    masked = sum(k == 0 for g in groups for c in g["completions"] for k in c["tokens"]["model"])
    styles = driver.execute_script("return [...document.querySelectorAll('.completion .tok.masked')].map(s => "
                                   "[s.style.background, getComputedStyle(s).color, s.closest('.turn').className])")
    assert masked > 0 and len(styles) == masked  # every tool token, and only those, is marked
    assert {(bg, turn) for bg, _, turn in styles} == {("", "turn tool")} and styles[0][1] == "rgb(148, 163, 184)"
    trained = driver.find_elements("css selector", ".turn.model .tok.trained")
    assert trained and all(t.get_attribute("style").startswith("background") for t in trained)
    assert "tool tokens: read, not trained" in driver.find_element("id", "masked-legend").text
    next(t for t in driver.find_elements("css selector", ".completion .tok.masked") if t.text.strip()).click()
    assert "not trained" in driver.find_element("id", "token-detail").text
    open_page(driver, site, "groups?run=tiny")  # a single-turn run shows as before: one run of tokens per answer
    pieces = wait_for(lambda: driver.execute_script("return document.querySelectorAll('.completion .tokens').length"),
                      what="the tiny run's groups")
    assert pieces == len(driver.find_elements("css selector", ".completion"))
    assert not driver.find_elements("css selector", ".turn, .tok.masked, #masked-legend")
    assert not console_errors(driver)


def _check_run(path, held_out):
    """A synthetic `aha demo aha` run: behaviour metrics each step, held-out greedy ones every 10 steps."""
    rates = ("reflection_rate", "correction_rate", "wait_fixed_rate", "wait_broke_rate", "empty_reflection",
             "accuracy/reflective", "accuracy/direct")
    held = lambda s: {"eval/accuracy": 0.6 + s / 100, **{f"eval/behaviour/{k}": 0.02 * s for k in rates}}  # noqa: E731
    rows = [{"step": s, **({f"behaviour/{k}": 0.01 * s + 0.1 * i for i, k in enumerate(rates)} if s else {}),
             "completion/len_mean": 24 - s / 10, **(held(s) if s % 10 == 0 else {})} for s in range(0, 21)]
    return _write_run(path, rows, held_out=held_out, config="num_generations: 8\nreflection_phrases: [wait, check]\n")


def test_the_aha_tracker_draws_what_the_checks_did_and_shows_the_moment_side_by_side(driver, site, shots):
    _own_runs()
    from test_dashboard import FIXED, WRONG, _held_out_row
    _check_run(ROOT["path"] / "x_moment", [_held_out_row(0, 7, WRONG, False, False, False),
                                           _held_out_row(10, 7, WRONG, False, False, False),
                                           _held_out_row(20, 7, FIXED, True, False, True)])
    open_page(driver, site, "aha?run=x_moment")
    before = wait_for(lambda: driver.find_elements("css selector", "#aha-moment pre.before"), what="the moment")[0]
    after = driver.find_element("css selector", "#aha-moment pre.after")
    assert before.text == WRONG and after.text == FIXED
    b, a = before.rect, after.rect
    assert b["x"] + b["width"] <= a["x"] and abs(b["y"] - a["y"]) < 5  # side by side
    marks = driver.find_elements("css selector", "#aha-moment pre.after mark.reflect")
    assert [m.text for m in marks] == ["check", "wait"]  # the run's reflection phrases, marked
    assert "wrong at step 10, fixed by a “wait” at step 20" in driver.find_element("id", "aha-moment").text
    for metric in ("reflection_rate", "correction_rate", "wait_fixed_rate", "wait_broke_rate", "empty_reflection"):
        got = _chart(driver, f"check/{metric}")
        assert got["series"][1:] == ["sampled", "held-out greedy"], metric
        assert got["data"][2][10] == pytest.approx(0.2) and got["data"][2][5] is None  # held-out: each evaluation
    assert len(_chart(driver, "check/accuracy")["series"]) == 5  # step, then reflective and direct, each twice
    assert _chart(driver, "check/eval_accuracy")["data"][1][20] == pytest.approx(0.8)
    driver.save_screenshot(str(shots / "aha_moment.png"))
    _check_run(ROOT["path"] / "x_no_moment", [_held_out_row(s, 7, WRONG, False, False, False) for s in (0, 10, 20)])
    open_page(driver, site, "aha?run=x_no_moment")
    note = wait_for(lambda: driver.find_elements("id", "no-moment"), what="the note")[0]
    assert "No held-out problem was fixed by a reflection in this run" in note.text
    assert not driver.find_elements("id", "aha-moment") and _chart(driver, "check/correction_rate")
    assert not console_errors(driver)


def test_a_bad_line_is_a_note_by_its_number_beside_the_rest_and_run_files_open_inert(driver, tmp_path, shots):
    """A NaN is a gap in its curve; a malformed line is a note naming its file and line beside the groups that are
    well-formed; a run's image opens as an image, its .html never runs; the pages run under their policy (no eval)."""
    _own_runs()
    import json

    from test_dashboard import GROUP, PNG
    from aha.config import DashboardConfig
    from aha.dashboard import build_app
    from aha.dashboard.server import Server
    run = _write_run(tmp_path / "runs" / "r")
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.1}\n{"step": 2, "reward/mean": NaN}\n'
                                       '{"step": "x"}\n{"step": 3, "reward/mean": 0.3}\n')
    (run / "groups.jsonl").write_text(f'{{"step": 2, "mean": NaN, {json.dumps(GROUP)[1:]}\n'
                                      '{"step": 2, "group": 1, "completions": "x"}\ngarbage\n')
    (run / "plot.png").write_bytes(PNG)
    (run / "evil.html").write_text("<script>document.title = 'ran'</script>")
    (run / "evil.png").write_text("<html><script>document.title = 'ran'</script></html>")
    server = Server(build_app(DashboardConfig(runs_root=str(tmp_path / "runs"), playground_dir=str(tmp_path / "pg"))))
    url = server.start()
    notes = lambda: [e.text for e in driver.find_elements("css selector", ".bad-line")]  # noqa: E731
    try:
        open_page(driver, url, "curves?runs=r")
        _js_wait(driver, "return window.ahaCharts.some(c => c.key === 'reward/mean')", "the curve")
        assert _chart(driver, "reward/mean")["data"][1] == [0.1, None, 0.3]  # NaN: a gap
        assert any("metrics.jsonl line 3: step is not an integer" in n for n in notes())
        open_page(driver, url, "groups?run=r")
        wait_for(lambda: driver.find_elements("css selector", ".group"), what="the well-formed group")
        assert notes() == ["r: groups.jsonl line 3: not JSON: Expecting value; skipped: garbage",  # of no step
                           "groups.jsonl line 2: completions is not a list of objects"]  # in place of its group
        driver.save_screenshot(str(shots / "groups_bad_lines.png"))
        open_page(driver, url, "aha?run=r")
        assert any("groups.jsonl line 2" in n for n in notes()) and "2 wait" in driver.find_element("id", "aha-table").text
        assert not console_errors(driver)
        assert driver.execute_script("const s = document.createElement('script'); s.textContent = 'window.inline = 1'; "
                                     "document.head.append(s); return window.inline === undefined")  # no inline script
        driver.get(f"{url}/api/file?run=r&path=plot.png")
        assert wait_for(lambda: driver.execute_script(
            "const i = document.images[0]; return i && i.complete ? i.naturalWidth : 0"), what="the image") == 1
        for name in ("evil.html", "evil.png"):
            driver.get(f"{url}/api/file?run=r&path={name}")
            time.sleep(0.3)
            assert driver.title != "ran", name
    finally:
        server.stop()
