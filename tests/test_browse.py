"""What a researcher sees, in a real browser: headless Chromium (Debian's ``chromium``
and ``chromedriver``, driven by selenium) against a real ``asolab ui`` over a store
with a run and a small study, and against the compare report.

Skipped, with the reason, where Chromium, chromedriver or selenium is missing
(``.ci/run`` installs them). Set ``ASOLAB_SCREENSHOTS=DIR`` to keep screenshots.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import processes
import pytest
from chromium import CHROMIUM, DRIVER, missing
from mlflow import MlflowClient
from ports import free_port

from asolab.tracking import layout as L

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')"
)
if missing(CHROMIUM, DRIVER):
    pytest.skip(missing(CHROMIUM, DRIVER), allow_module_level=True)

from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

# One worker builds the module's store, asolab ui and browser (--dist loadgroup), not both.
pytestmark = pytest.mark.xdist_group("browse")

SHOTS = os.environ.get("ASOLAB_SCREENSHOTS", "")

TINY = """
seed = 0
device = "cpu"
threads = 1
[data]
name = "digits"
train_subset = 200
[space]
init_channels = 4
[search]
cycles = 1
w_epochs = 1
alpha_epochs = 1
retrain_epochs = 1
final_epochs = 0
[tracking]
log_models = false
"""

STUDY = """
name = "tiny"
experiment = "tiny.toml"
n_trials = 2
[objective]
seeds = 2
[sampler]
name = "random"
[pruner]
name = "none"
[params.temperature.initial_temperature]
low = 0.5
high = 10.0
log = true
[params.mutation.strength]
low = 0.0
high = 1.0
"""


def _number_in(value: float, text: str) -> bool:
    """Whether the UI shows ``value``: MLflow's tables print a metric whole (0.0989583...)
    or rounded (0.099), so either form's first three decimals will do."""
    return str(value)[:5] in text or f"{value:.3f}" in text


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """A store with one run (experiment "tiny") and a two-trial study, recorded by the CLI."""
    from asolab.cli import main

    d = tmp_path_factory.mktemp("browse")
    (d / "tiny.toml").write_text(TINY)
    (d / "tiny_study.toml").write_text(textwrap.dedent(STUDY))
    uri = f"sqlite:///{d / 'mlflow.db'}"
    assert main(["run", str(d / "tiny.toml"), "--set", f"tracking.tracking_uri={uri}"]) == 0
    assert (
        main(
            [
                "study",
                str(d / "tiny_study.toml"),
                "--storage",
                str(d / "journal.log"),
                "--tracking-uri",
                uri,
            ]
        )
        == 0
    )
    # optuna-dashboard names the objective; the study's run describes the study
    import optuna

    journal = optuna.storages.journal.JournalFileBackend(str(d / "journal.log"))
    study = optuna.load_study(study_name="tiny", storage=optuna.storages.JournalStorage(journal))
    assert study.metric_names == ["val_acc"]
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("study-tiny")
    parent = [
        r for r in c.search_runs([exp.experiment_id]) if r.data.tags.get("asolab.study_parent")
    ][0]
    note = parent.data.tags[L.TAG_NOTE]
    assert "maximize `val_acc`" in note and f"trial {study.best_trial.number}]" in note, note
    return {"dir": d, "uri": uri}


@pytest.fixture(scope="module")
def ui(store) -> dict:
    """A real ``asolab ui`` on a free port, stopped (its whole process group) afterwards.
    Forked from the preloaded server of tests/processes.py: the page is what is tested, not
    the interpreter's start-up (``mlflow server`` under it is a fresh process as ever)."""
    port = free_port()
    proc = processes.Popen(  # the module's tests share it
        [
            sys.executable,
            "-m",
            "asolab.cli",
            "ui",
            "--port",
            str(port),
            "--tracking-uri",
            store["uri"],
        ],
        stdout=processes.PIPE,
        stderr=processes.STDOUT,
        start_new_session=True,
    )
    processes.outlives_the_test(proc)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 240  # a loaded CI machine starts mlflow server slowly
        while time.time() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(base + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail(f"asolab ui did not come up on {base}")
        yield {"base": base, **store}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out = proc.communicate(timeout=30)[0].decode()
        # it printed the model-training view's address of every experiment's runs table
        assert "workflowType=machine_learning" in out and "viewStateShareKey=asolab" in out, out
        # and not the server's access log: that went to ui.log beside the store
        assert '"GET /' not in out and '"POST /' not in out, out[-2000:]
        assert '"GET /' in (store["dir"] / "ui.log").read_text()


@pytest.fixture(scope="module")
def browser():
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    opts = Options()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--hide-scrollbars",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _wait_text(driver, *texts: str, timeout: float = 40) -> str:
    """The page's visible text once it shows every one of ``texts`` (the UI renders via AJAX)."""
    body = ""

    def ready(d) -> bool:
        nonlocal body
        body = d.find_element(By.TAG_NAME, "body").text
        return all(t in body for t in texts)

    try:
        WebDriverWait(driver, timeout, poll_frequency=0.5).until(ready)
    except Exception:
        missing = [t for t in texts if t not in body]
        raise AssertionError(f"the page never showed {missing}; it shows:\n{body[:3000]}") from None
    return body


def _shot(driver, name: str) -> None:
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / f"{name}.png"))


def test_mlflow_ui_shows_runs_descriptions_pictures_and_trials(ui, browser) -> None:
    from asolab.tracking.browse import run_url, runs_url

    browser.set_window_size(1900, 1000)  # room for asolab's columns beside MLflow's panel
    c = MlflowClient(ui["uri"])
    exp = c.get_experiment_by_name("tiny")
    assert exp.tags[L.TAG_EXPERIMENT_KIND] == L.EXPERIMENT_KIND
    run = [r for r in c.search_runs([exp.experiment_id]) if L.TAG_STUDY not in r.data.tags][0]
    genotype = run.data.tags[L.TAG_FINAL_GENOTYPE]

    # The runs table, as `asolab run` prints it: the model-training view (no GenAI tabs),
    # asolab's columns (accuracy, parameters, temperature, mutation strength, genotype).
    browser.get(runs_url(ui["base"], exp.experiment_id))
    # (the grid renders only the columns in view: the first of asolab's metric columns)
    body = _wait_text(
        browser, run.info.run_name, "Model training", "final_params", "final_peak_rss_mb"
    )
    assert "Judges" not in body and "Evaluation runs" not in body, body[:2000]
    test_acc = run.data.metrics["test_acc"]
    assert _number_in(test_acc, body), f"no test_acc ({test_acc}) column: {body[:2000]}"
    _shot(browser, "runs_table")
    # further right: the data set's column (the best trial's is in the study's table)
    _scroll_grid(browser)
    _wait_text(browser, "asolab.dataset", "digits")
    _shot(browser, "runs_table_right")

    # The run's overview: its description with the canonical genotype, and the final cells.
    browser.get(run_url(ui["base"], exp.experiment_id, run.info.run_id))
    body = _wait_text(browser, "Final genotype", "test acc", "Show more")
    assert f"Final genotype {genotype}" in " ".join(body.split()), body[:3000]
    # before "Show more" (the UI shows the description's first 100 px): the accuracies,
    # parameters, peak memory, wall time and the strip of cells, loaded and not cut off
    first = _first_screen(browser)
    for shown in ("val acc", "test acc", "params", "peak memory", "wall time"):
        assert shown in first["text"], first
    assert first["strip"] == "shown", first
    _shot(browser, "run_first_screen")
    for more in browser.find_elements(By.XPATH, "//*[normalize-space(text())='Show more']"):
        browser.execute_script("arguments[0].click()", more)
    _wait_text(browser, "peak memory", "wall time", "mutation strength")
    WebDriverWait(browser, 30).until(
        lambda d: any(
            "cells%2Ffinal.png" in (i.get_attribute("src") or "")
            and d.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", i)
            for i in d.find_elements(By.TAG_NAME, "img")
        )
    )
    _shot(browser, "run_overview")

    # The study: its trials nested under the parent run, each with a distinct name, and
    # each trial's seed runs nested under the trial's run.
    study_exp = c.get_experiment_by_name("study-tiny") or exp
    every = c.search_runs([study_exp.experiment_id])
    parent = [r for r in every if r.data.tags.get("asolab.study_parent")][0]
    trials = [r for r in every if r.data.tags.get(L.MLFLOW_PARENT_RUN) == parent.info.run_id]
    names = [r.info.run_name for r in trials]
    assert len(names) == 2 and len(set(names)) == 2
    seeds = {
        t.info.run_id: sorted(
            r.info.run_name for r in every if r.data.tags.get(L.MLFLOW_PARENT_RUN) == t.info.run_id
        )
        for t in trials
    }
    assert all(len(v) == 2 for v in seeds.values()), seeds
    browser.get(runs_url(ui["base"], study_exp.experiment_id))
    _wait_text(browser, "study-tiny")
    # nested: the trials are hidden under the study's row until its expander opens them
    body = browser.find_element(By.TAG_NAME, "body").text
    assert not any(n in body for n in names), body[:2000]
    _expand(browser, parent.info.run_id)
    body = _wait_text(browser, *names)
    first_trial = min(body.index(n) for n in names)
    assert body.index("study-tiny", body.index("Run Name")) < first_trial, body[:2000]
    # a trial is one row: its seed runs stay folded under it, and the row reads the
    # trial's objective (the mean over its seeds) in the final_val_acc column
    assert not any(n in body for v in seeds.values() for n in v), body[:2000]
    for t in trials:
        row = _row_text(browser, t.info.run_id)
        mean = t.data.metrics["final_val_acc"]
        assert _number_in(mean, row), (mean, row)
        size = t.data.metrics["final_params"]
        assert size == int(size) and str(int(size)) in row.replace(",", ""), (size, row)
    _shot(browser, "study_trials")
    _scroll_grid(browser)
    _wait_text(browser, "asolab.best")
    best_trial = [t for t in trials if t.data.tags.get(L.TAG_BEST) == "true"]
    assert len(best_trial) == 1 and "true" in _row_text(browser, best_trial[0].info.run_id)
    _shot(browser, "study_trials_right")
    _scroll_grid(browser, 0)
    first = min(trials, key=lambda r: r.info.run_name)
    _expand(browser, first.info.run_id)
    body = _wait_text(browser, *seeds[first.info.run_id])
    # the seed rows come right under their trial's row, trial and seed first in their names
    at = body.index(first.info.run_name)
    assert all(body.index(n) > at for n in seeds[first.info.run_id]), body[:2000]
    assert [n.split()[:2] for n in seeds[first.info.run_id]] == [
        [first.info.run_name.split()[0], f"seed{s}"] for s in (0, 1)
    ]
    _shot(browser, "study_trial_seeds")
    # a trial's description: its per-seed table reads as columns, not "seedval acctest acc"
    browser.get(run_url(ui["base"], study_exp.experiment_id, first.info.run_id))
    body = _wait_text(browser, "Trial", "seed")
    assert re.search(r"seed +val acc +test acc +parameters", body), body[-2000:]
    for more in browser.find_elements(By.XPATH, "//*[normalize-space(text())='Show more']"):
        browser.execute_script("arguments[0].click()", more)
    browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    for scroller in browser.find_elements(By.CSS_SELECTOR, "main, [class*='scroll']"):
        browser.execute_script("arguments[0].scrollTop = arguments[0].scrollHeight", scroller)
    _shot(browser, "trial_description")


def _scroll_grid(browser, to: int = 100_000) -> None:
    """Scroll the runs table sideways (its columns render only when in view)."""
    for bar in browser.find_elements(
        By.CSS_SELECTOR, ".ag-body-horizontal-scroll-viewport, .ag-center-cols-viewport"
    ):
        browser.execute_script("arguments[0].scrollLeft = arguments[1]", bar, to)
    time.sleep(1)


def _first_screen(browser) -> dict:
    """What the run description shows before "Show more": the text inside the folded box
    (the ancestor that clips it) and whether the cells' strip is loaded and fully in it."""
    more = browser.find_elements(By.XPATH, "//*[normalize-space(text())='Show more']")
    assert more, "no Show more"
    browser.execute_script("arguments[0].scrollIntoView({block: 'end'})", more[0])
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script(
            "const i = Array.from(document.images).find(i => i.src.includes('final_thumb.png'));"
            "return i && i.complete && i.naturalWidth > 0"
        )
    )
    return browser.execute_script(
        """
        const img = Array.from(document.images).find(i => i.src.includes('final_thumb.png'));
        let box = img.parentElement;
        while (box && getComputedStyle(box).overflow !== 'hidden') box = box.parentElement;
        const b = box.getBoundingClientRect(), r = img.getBoundingClientRect();
        const range = document.createRange();
        const seen = [];
        const walk = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
        while (walk.nextNode()) {
          range.selectNodeContents(walk.currentNode);
          const t = range.getBoundingClientRect();
          if (t.height && t.bottom <= b.bottom + 1) seen.push(walk.currentNode.textContent);
        }
        return {text: seen.join(' '), box: b.height,
                strip: r.top >= b.top && r.bottom <= b.bottom + 1 ? 'shown' : 'cut off'};
        """
    )


def _expand(browser, run_id: str) -> None:
    """Click the expander on a run's row of the runs table (it opens the nested runs)."""
    expander_css = f"[row-id='{run_id}'] [col-id=\"attributes.`Run Name`\"] button"
    try:  # the grid shows the row's text before it renders the row's buttons
        expander = WebDriverWait(browser, 40, poll_frequency=0.5).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, expander_css)
        )
    except TimeoutException:
        expander = []
    assert expander, f"no expander on the row of run {run_id}"
    expander[0].click()


def _row_text(browser, run_id: str) -> str:
    """A run's row as the grid shows it (its pinned and scrolling parts together)."""
    return " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, f"[row-id='{run_id}']"))


def test_compare_report_fits_1400px_and_links_every_run(store, browser, tmp_path) -> None:
    from asolab.cli import main

    out = tmp_path / "report"
    assert main(["compare", "--tracking-uri", store["uri"], "--report", str(out)]) == 0
    page = out / "index.html"
    browser.set_window_size(1400, 1000)
    browser.get(page.as_uri())
    _wait_text(browser, "Runs", "Genotype clusters")
    width = browser.execute_script("return document.documentElement.clientWidth")
    scroll = browser.execute_script("return document.documentElement.scrollWidth")
    assert scroll <= width, f"the report is {scroll} px wide in a {width} px window"
    links = browser.find_elements(By.CSS_SELECTOR, "a.run")
    c = MlflowClient(store["uri"])
    ids = {
        r.info.run_id
        for e in c.search_experiments()
        for r in c.search_runs([e.experiment_id])
        if L.TAG_FINAL_GENOTYPE in r.data.tags
    }
    assert {a.get_attribute("href").split("/runs/")[1].split("?")[0] for a in links} == ids
    # a genotype row is a few lines, never a tall column of broken words
    rows = browser.find_elements(By.CSS_SELECTOR, "table.runs tbody tr")
    assert rows and max(r.size["height"] for r in rows) < 60
    # and no word broken across lines: a cell of one word ("digits", "exponential",
    # "FINISHED") is one line box (a word was split when every cell could break anywhere)
    broken = browser.execute_script(
        """
        const out = [];
        for (const td of document.querySelectorAll("table.runs tbody td")) {
          const text = td.textContent.trim();
          if (td.children.length || !text || /[\\s-]/.test(text)) continue;
          const range = document.createRange();
          range.selectNodeContents(td);
          if (range.getClientRects().length > 1) out.push(text);
        }
        return out;
        """
    )
    assert broken == [], broken
    _shot(browser, "compare_report")
