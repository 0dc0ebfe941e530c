"""What a person looks at: the figures, the Snakemake report (opened in a real headless Chromium), the
end-of-run table and the one line per failed job, all on the tiny end-to-end run."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from headless_chromium import HeadlessChromium
from PIL import Image, ImageStat
from tiny_run import PROMPTS, RESULTS_ROOT, snakemake, tiny_config, write_prompts

from eaglepipe.figures import FIGURES
from eaglepipe.figures.summary import stage_times, stopped_short_note
from eaglepipe.layout import RunLayout
from eaglepipe.progress import StepProgress, eta_seconds, format_eta

REPO = Path(__file__).resolve().parent.parent
# Kept after the run (CI can collect it): what the report looked like in a browser.
ARTIFACTS = REPO / "test-artifacts"


def is_drawn(path: Path) -> bool:
    """A readable image with something on it: not one flat colour."""
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        extrema = image.convert("L").getextrema()
        return image.width > 100 and image.height > 100 and extrema[1] - extrema[0] > 64


@pytest.mark.slow
def test_every_figure_is_a_drawn_png(tiny_pipeline):
    figures = tiny_pipeline / RESULTS_ROOT / "figures"
    for stem in FIGURES:
        path = figures / f"{stem}.png"
        assert path.stat().st_size > 5_000, path
        assert is_drawn(path), path
    table = (figures / "run_summary.txt").read_text()
    assert "emulated" in table and all(ds in table for ds in PROMPTS)


@pytest.mark.slow
def test_the_report_is_one_page_holding_every_figure(tiny_pipeline):
    report = tiny_pipeline / RESULTS_ROOT / "report.html"
    run = snakemake(tiny_pipeline, "--report", str(report))
    assert run.returncode == 0, run.stderr[-3000:]
    html = report.read_text()
    for stem in (*FIGURES, "run_summary"):
        assert f"{stem}." in html, stem
    for caption_phrase in ("Acceptance length", "Output tokens per answer", "budget.usd", "held-out"):
        assert caption_phrase in html, caption_phrase
    # Self-contained: nothing is fetched from a server when it opens.
    assert 'src="http' not in html and "<script src=" not in html


@pytest.mark.slow
def test_chromium_renders_the_report(tiny_pipeline):
    chromium = shutil.which("chromium")
    assert chromium, "the report test needs Debian's chromium: `make browser` (as root) installs it"
    report = tiny_pipeline / RESULTS_ROOT / "report.html"
    if not report.is_file():
        assert snakemake(tiny_pipeline, "--report", str(report)).returncode == 0
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "report-screenshot.png"
    screenshot.unlink(missing_ok=True)
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--window-size=1400,1000", "--virtual-time-budget=10000", f"--screenshot={screenshot}",
               report.as_uri()]
    run = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert screenshot.is_file(), run.stderr[-2000:]
    with Image.open(screenshot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
        # A blank page is one colour; a rendered report has text, a menu and its colours.
        assert len(colours) > 50 and ImageStat.Stat(image.convert("L")).stddev[0] > 10


@pytest.mark.slow
def test_the_report_opens_on_the_workflow_and_its_run_section_shows_the_table(tiny_pipeline):
    """As a person reads it in Chromium: the landing page holds the description beside the workflow's graph,
    and section 0, one click and its eye button away, shows the end-of-run table itself (not a download)."""
    chromium = shutil.which("chromium")
    assert chromium, "the report test needs Debian's chromium: `make browser` (as root) installs it"
    layout = RunLayout.from_paths(tiny_pipeline / RESULTS_ROOT, tiny_pipeline / RESULTS_ROOT / "prompts")
    if not layout.report.is_file():
        assert snakemake(tiny_pipeline, "--report", str(layout.report)).returncode == 0
    table = layout.run_summary.read_text().strip()
    with HeadlessChromium(chromium) as browser:
        tab = browser.open(layout.report.as_uri())
        browser.wait_for(tab, "document.body.innerText.includes('Start with 0. Run')"
                              " && !!document.querySelector('#rulegraph canvas, #rulegraph svg')")
        browser.evaluate(tab, "[...document.querySelectorAll('a')].find(a => a.innerText.trim() === '0. Run')"
                              ".click()")
        browser.wait_for(tab, "document.body.innerText.includes('run_summary.html')")
        browser.evaluate(tab, "document.querySelector('table a[type=button]').click()")
        deadline = time.monotonic() + 30
        while not any(table in text for text in browser.frame_texts(tab)) and time.monotonic() < deadline:
            time.sleep(0.2)
        shown = browser.frame_texts(tab)
        ARTIFACTS.mkdir(exist_ok=True)
        (ARTIFACTS / "report-run-section.png").write_bytes(browser.screenshot(tab))
    assert any(table in text for text in shown), shown


@pytest.mark.slow
def test_the_run_ends_with_its_table(tiny_pipeline):
    run = snakemake(tiny_pipeline, "--forcerun", "figures")
    assert run.returncode == 0, run.stderr[-3000:]
    table = run.stderr.split("eaglepipe: end of run")[1]
    assert "(emulated" in table.splitlines()[0]
    rows = {line.split()[0]: line.split() for line in table.splitlines() if line.startswith("tiny-")}
    assert set(rows) == set(PROMPTS)
    for ds, row in rows.items():
        assert row[1] == str(len(PROMPTS[ds])), row  # every prompt answered
    assert "trained drafter" in table and "prompt lookup" in table and "untrained drafter" in table
    # The report command in the form this run was started with, runnable as printed.
    hint = f".venv/bin/snakemake --configfile {tiny_pipeline / 'tiny.yaml'} --report results/demo/report.html"
    assert hint in table
    # The time each stage took in this invocation, from Snakemake's own run log: here the one job it ran.
    times = next(line for line in table.splitlines() if line.startswith("time, this invocation: "))
    assert re.fullmatch(r"time, this invocation: figures \d+ s \(1 job\); all of it \d+ s", times), times


@pytest.mark.slow
def test_a_run_cut_by_until_says_it_stopped_where_asked(tiny_pipeline):
    run = snakemake(tiny_pipeline, "--forcerun", "figures", "--until", "figures")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "eaglepipe: stopped where --until figures asked" in run.stderr
    assert "the same command without --until goes on from here" in run.stderr


@pytest.mark.slow
def test_outputs_say_what_they_are(tiny_pipeline):
    """eval.json's per-prompt entries name their prompt and set; emulated summaries say so."""
    results = tiny_pipeline / RESULTS_ROOT
    evaluation = json.loads((results / "drafter" / "eval.json").read_text())
    for method in evaluation["methods"].values():
        assert {(e["set"], e["prompt_id"]) for e in method["per_prompt"]} <= {
            (ds, pid) for ds in PROMPTS for pid in json.loads((results / ds / "tokens.json").read_text())[
                "prompt_ids"]
        }
        assert {e["set"] for e in method["per_prompt"]} == set(PROMPTS)
        assert len(method["acceptance_rate_per_position"]) == evaluation["settings"]["num_steps"]
    summary = json.loads((results / "tiny-a" / "responses.summary.json").read_text())
    assert summary["emulated"] is True and "nothing was bought" in summary["notes"]["emulated"]
    assert "max_tokens (12)" in summary["notes"]["truncated"]


@pytest.mark.slow
def test_a_failed_job_is_named_with_its_log(tmp_path, model_dir):
    (tmp_path / "sources").mkdir()
    write_prompts(tmp_path, "tiny-a", PROMPTS["tiny-a"])
    (tmp_path / "sources" / "tiny-b.jsonl").write_text("{not json\n")
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(tiny_config(model_dir)))
    run = snakemake(tmp_path, "--until", "prompts")
    assert run.returncode != 0
    failed = [line for line in run.stderr.splitlines() if line.startswith("eaglepipe: job ")]
    log = f"{RESULTS_ROOT}/logs/prompts/tiny-b.log"
    assert failed == [f"eaglepipe: job prompts (ds=tiny-b) failed: see {log}"]


def test_progress_lines_come_at_a_steady_interval_with_speed_and_eta(caplog):
    now = [0.0]
    log = logging.getLogger("eaglepipe.test.progress")
    progress = StepProgress(log, "training", 10, unit="steps", every_s=30, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger=log.name):
        for _ in range(10):
            now[0] += 10
            progress.advance(1, 100)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == "training: 3/10 steps (30%), 10 tokens/s, elapsed 0m30s, ETA 1m10s"
    assert len(lines) == 4 and lines[-1].startswith("training: 10/10 steps (100%)")


def test_the_eta_waits_for_a_stated_minimum_of_answers_so_that_it_does_not_climb():
    """The demo's chat set: 24 prompts in flight at once, answers at 31 s (1), 61 s (4), 92 s (8), 123 s (13).
    From the first answer on, the pace of finished answers gave 11m53s, 5m04s, 2m53s, 1m44s; from half the
    first wave on, the ETA starts at the last and only falls."""
    arrivals = [(31.0, 1), (61.0, 4), (92.0, 8), (123.0, 13), (124.0, 20)]
    etas = [eta_seconds(at, done, 24 - done, minimum=12) for at, done in arrivals]
    assert etas[:3] == [None, None, None] and [format_eta(eta) for eta in etas[3:]] == ["1m44s", "0m24s"]
    assert format_eta(None) == "--" and eta_seconds(5.0, 0, 0, minimum=12) == 0.0


def test_reused_work_moves_progress_but_not_the_eta(caplog):
    now = [0.0]
    log = logging.getLogger("eaglepipe.test.progress")
    progress = StepProgress(log, "hidden states", 1000, unit="tokens", every_s=0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger=log.name):
        progress.advance(500, reused=True)  # a shard kept from an earlier run, found at once
        now[0] += 10
        progress.advance(250, 250)
    assert caplog.records[-1].getMessage() == (
        "hidden states: 750/1000 tokens (75%), 25 tokens/s, elapsed 0m10s, ETA 0m10s"
    )


# Snakemake 9's run log as it reads with two jobs side by side.
SNAKEMAKE_LOG = """\
Select jobs to execute...
Execute 2 jobs...
[Sun Dec  6 07:36:47 2026]
localrule generate:
    wildcards: ds=tiny-a
    jobid: 3
[Sun Dec  6 07:36:48 2026]
rule generate:
    wildcards: ds=tiny-b
    jobid: 4
[Sun Dec  6 07:37:50 2026]
Finished jobid: 3 (Rule: generate)
[Sun Dec  6 07:38:02 2026]
Finished jobid: 4 (Rule: generate)
[Sun Dec  6 07:38:02 2026]
localrule tokens:
    jobid: 5
[Sun Dec  6 08:40:05 2026]
Finished jobid: 5 (Rule: tokens)
[Sun Dec  6 08:40:05 2026]
localrule all:
    jobid: 0
[Sun Dec  6 08:40:05 2026]
Finished jobid: 0 (Rule: all)
"""


def test_stage_times_span_each_stages_jobs_and_the_whole_invocation(tmp_path):
    log = tmp_path / "run.snakemake.log"
    log.write_text(SNAKEMAKE_LOG)
    assert stage_times([str(log)]) == (
        "time, this invocation: generate 1 min 15 s (2 jobs), tokens 1 h 02 min (1 job); all of it 1 h 03 min"
    )
    assert stage_times(tmp_path / "absent.log") is None


def test_only_a_cut_run_gets_the_stopped_short_note():
    assert stopped_short_note(["snakemake", "--cores", "2"]) is None
    note = stopped_short_note(["snakemake", "--until", "generate", "tokens", "--cores", "2"])
    assert note and "--until generate, tokens asked" in note
