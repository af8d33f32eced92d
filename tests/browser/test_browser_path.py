"""A student's path, in a real browser, light and dark: from the Overview through the first three pages
of the path, answering each page's opening question wrong (the hint shows) and then right (the answer's
why shows, the locked control opens), then Check yourself scores what was answered at the first try.

Screenshots: ``artifacts/screenshots/path_<page>_<light|dark>.png`` after each page's answer, and
``path_check_yourself_<scheme>.png``.
"""
from __future__ import annotations

import pytest

from browser_support import (SCREENSHOTS, answer_question, chromium_or_skip, error_texts, failure_screenshot,
                             launch_options, wait_idle)
from core.lessons import path, questions

VIEWPORT = {"width": 1400, "height": 900}
COLD_MS = 240_000
WALK = [s.page for s in path.STEPS[:3]]


@pytest.fixture(scope="module")
def browser(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        br = pw.chromium.launch(**launch_options(chromium_or_skip()))
        yield br
        br.close()


def alerts(page) -> str:
    return " ".join(page.locator("[data-testid=stAlert]").all_inner_texts())


def screenshot(page, name: str) -> None:
    height = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": int(min(max(height, VIEWPORT["height"]), 12_000))})
    page.wait_for_timeout(400)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    page.set_viewport_size(VIEWPORT)


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_a_student_walks_the_path_and_check_yourself_scores_first_tries(browser, server, scheme):
    ctx = browser.new_context(viewport=VIEWPORT, color_scheme=scheme)
    page = ctx.new_page()
    try:
        page.goto(server.url + "/")
        wait_idle(page, timeout_ms=COLD_MS)
        for i, address in enumerate(WALK, start=1):
            # the Overview's link for the first page, then each page's own "First see" links lead on
            if i == 1:
                page.locator("[data-testid=stPageLink] a").filter(has_text=f"1. {path.step(address).title}").click()
            else:
                page.locator("[data-testid=stSidebarNav] a").filter(has_text=path.step(address).title).first.click()
            wait_idle(page, timeout_ms=COLD_MS)
            assert page.url.rstrip("/").endswith("/" + address)
            q = questions.opening(address)
            assert "Answer first" in page.locator("[data-testid=stMain]").inner_text()
            wrong = next(o for j, o in enumerate(q.options) if j != q.answer) if q.options else q.answer * 2 + 1
            answer_question(page, q, wrong)
            assert "Not yet. Hint:" in alerts(page), f"{address}: no hint after a wrong answer"
            answer_question(page, q, q.options[q.answer] if q.options else q.answer_text)
            assert "Right." in alerts(page), f"{address}: the right answer was not marked right"
            assert "Answer first" not in page.locator("[data-testid=stMain]").inner_text()
            assert error_texts(page) == []
            screenshot(page, f"path_{address}_{scheme}")
        page.locator("[data-testid=stSidebarNav] a").filter(has_text="Check yourself").click()
        wait_idle(page, timeout_ms=COLD_MS)
        body = page.locator("[data-testid=stMain]").inner_text()
        assert "0 of 3" in body                      # three answered, none right at the first try
        assert body.count("right at the second try") == 3
        screenshot(page, f"path_check_yourself_{scheme}")
    except Exception:
        failure_screenshot(page, f"path_{scheme}")
        raise
    finally:
        ctx.close()
