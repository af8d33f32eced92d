"""The "Induction heads" page in a real browser (Debian's Chromium driven by Playwright).

Opened by a link on its own server (a short training run, layer 1 head 2 chosen), it must draw
every chart with no error, and moving the held-out sequence slider must change the score of the
chosen head on that sequence. Skipped without Chromium or Playwright, as ``tests/browser/test_browser.py`` is.
"""
from __future__ import annotations

import pytest

from browser_support import (MAIN, SCREENSHOTS, charts_drawn, chromium_or_skip, discover_pages,
                             error_texts, launch_options, operate_first_slider, skip_or_fail, wait_idle)

VIEWPORT = {"width": 1400, "height": 900}
COLD_MS = 180_000
WARM_MS = 60_000


@pytest.fixture(scope="module")
def info():
    found = next((p for p in discover_pages() if p.path == "views/induction.py"), None)
    if found is None:
        pytest.skip("app.py lists no induction page")
    if not found.exists:
        skip_or_fail(f"{found.path} is listed in app.py but not written yet")
    return found


def metric_value(page, label: str) -> str:
    """The value of the ``st.metric`` labelled exactly ``label``."""
    for box in page.query_selector_all('[data-testid="stMetric"]'):
        lines = box.inner_text().splitlines()
        if lines and lines[0].strip() == label:
            return lines[-1].strip()
    raise AssertionError(f"no metric labelled {label!r}")


def test_a_link_opens_trained_heads_and_the_slider_moves_the_score(info, server):
    executable = chromium_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(**launch_options(executable))
        pg = browser.new_context(viewport=VIEWPORT).new_page()
        js_errors: list[str] = []
        pg.on("pageerror", lambda exc: js_errors.append(str(exc)))
        try:
            pg.goto(server.page_url(info, "steps=100&layer=1&head=2"))
            wait_idle(pg, timeout_ms=COLD_MS)
            assert pg.query_selector(f"{MAIN} h1"), "no title"
            assert error_texts(pg) == [] and js_errors == []
            assert "Layer 1, head 2" in pg.inner_text(MAIN)
            before = metric_value(pg, "L1H2 induction, this sequence")
            float(metric_value(pg, "loss, repeated segment"))
            total, drawn = charts_drawn(pg)
            assert total >= 6 and drawn == total, f"{drawn} of {total} charts drawn"
            assert operate_first_slider(pg), "no slider to move"
            wait_idle(pg, timeout_ms=WARM_MS)
            assert metric_value(pg, "L1H2 induction, this sequence") != before
            assert error_texts(pg) == [] and js_errors == []
            assert server.alive(), server.log()
        except BaseException:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            pg.screenshot(path=str(SCREENSHOTS / "FAILED_induction_browser.png"), full_page=True)
            raise
        finally:
            browser.close()
