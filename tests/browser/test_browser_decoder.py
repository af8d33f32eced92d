"""The "Decoder and generation" page in a real browser (Debian's Chromium driven by Playwright).

Opened by its link on its own server, it trains a few steps (the progress bar must reach the end
and the loss chart hold one point per step), then steps through one generation with the Next and
Previous buttons: the step text, the K/V cache's row count and the attention row must follow.
Skipped without Chromium or Playwright, as ``tests/browser/test_browser.py`` is.
"""
from __future__ import annotations

import re

import pytest

from browser_support import (CHART, MAIN, SCREENSHOTS, charts_drawn, chromium_or_skip,
                             discover_pages, error_texts, follow_run, launch_options, skip_or_fail, wait_idle)

VIEWPORT = {"width": 1400, "height": 900}
COLD_MS = 180_000
WARM_MS = 60_000
STEPS = 5
PROGRESS = re.compile(r"(\w+): step (\d+) of (\d+)")
STEP_TEXT = re.compile(r"Step (\d+) of (\d+)")


@pytest.fixture(scope="module")
def info():
    found = next((p for p in discover_pages() if p.path == "views/decoder.py"), None)
    if found is None:
        pytest.skip("app.py lists no decoder page")
    if not found.exists:
        skip_or_fail(f"{found.path} is listed in app.py but not written yet")
    return found


@pytest.fixture(scope="module")
def page(info, server):
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(**launch_options(executable))
        ctx = browser.new_context(viewport=VIEWPORT)
        pg = ctx.new_page()
        js_errors: list[str] = []
        pg.on("pageerror", lambda exc: js_errors.append(str(exc)))
        pg.goto(server.page_url(info, f"steps={STEPS}"))
        wait_idle(pg, timeout_ms=COLD_MS)
        pg.js_errors = js_errors
        try:
            yield pg
            assert server.alive(), server.log()
        finally:
            ctx.close()
            browser.close()


def metric_value(page, label: str) -> str:
    """The value of the ``st.metric`` whose label starts with ``label``."""
    for box in page.query_selector_all('[data-testid="stMetric"]'):
        text = box.inner_text()
        if text.startswith(label):
            return text.splitlines()[-1].strip()
    raise AssertionError(f"no metric labelled {label!r}")


def step_shown(page) -> tuple[int, int]:
    match = STEP_TEXT.search(page.inner_text(MAIN))
    assert match, "no 'Step s of n' text on the page"
    return int(match[1]), int(match[2])


def click_and_wait(page, name: str) -> None:
    page.get_by_role("button", name=name).click()
    page.wait_for_timeout(300)
    wait_idle(page, timeout_ms=WARM_MS)


def test_train_briefly_then_step_through_a_generation(page):
    try:
        check_train_and_step(page)
    except BaseException:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "FAILED_decoder_browser.png"), full_page=True)
        raise


def _progress(page) -> tuple[str, int, int] | None:
    """(status, step, target) from the progress bar's text, or None while it shows none."""
    bars = page.query_selector_all('[data-testid="stProgress"]')
    match = PROGRESS.search(bars[0].inner_text()) if bars else None
    return (match[1], int(match[2]), int(match[3])) if match else None


def check_train_and_step(page) -> None:
    assert page.query_selector(f"{MAIN} h1"), "no title"
    assert error_texts(page) == []
    assert "untrained" in page.inner_text(MAIN)
    # 1. a short run: the progress bar reaches its end, and the page then shows the trained model
    seen = follow_run(page, _progress, page.get_by_role("button", name="Train", exact=True).click)
    assert seen[-1] == ("done", STEPS, STEPS), f"the run ended as {seen[-1]} (progress seen: {seen})"
    wait_idle(page, timeout_ms=WARM_MS)
    assert "untrained" not in page.inner_text(MAIN)
    assert re.fullmatch(r"\d+\.\d{4}", metric_value(page, "Loss (last batch)"))
    # 2. one generation, a step at a time
    assert step_shown(page) == (1, 8)
    assert metric_value(page, "Rows in the K/V cache") == "1"
    for expected in (2, 3):
        click_and_wait(page, "Next ▶")
        assert step_shown(page) == (expected, 8)
        assert metric_value(page, "Rows in the K/V cache") == str(expected)
    click_and_wait(page, "◀ Previous")
    assert step_shown(page) == (2, 8)
    assert metric_value(page, "Rows in the K/V cache") == "2"
    total, drawn = charts_drawn(page)
    assert total >= 6 and drawn == total, f"{drawn} of {total} charts drawn"
    assert error_texts(page) == []
    assert page.js_errors == []
    assert page.query_selector_all(CHART)
