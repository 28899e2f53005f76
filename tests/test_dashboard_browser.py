"""The dashboard in a real headless Chromium (Debian's chromium + chromium-driver, through Selenium).

Without a browser these tests are skipped with the reason, except in CI (CI=true), where that is a failure.
Each page is saved as a PNG in $AHA_SCREENSHOTS (default: a temporary directory). With $AHA_DASHBOARD_ROOT the
pages show the runs under that directory instead of the small run these tests train.
"""

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
