"""Every page of the dashboard in a real browser (Debian's Chromium driven by Playwright).

One ``streamlit run app.py`` server on 127.0.0.1 serves the module. Each page listed in ``app.py``
(read from the file, so pages added later are covered) is opened by its URL path, left to finish
its script run, has its first slider / selectbox / number input operated, and must show no
traceback and no ``st.error`` box, with every chart drawn (an SVG with data marks, a plot area at
least ``MIN_PLOT_PX`` on a side). A full-page screenshot of each page goes
to ``artifacts/screenshots/<page>.png``. The training page also starts a run and must show the loss
curve growing.

Without Chromium or the ``playwright`` package the module is skipped with the reason, except under
``REQUIRE_BROWSER=1`` (CI), where that is a failure.
"""
from __future__ import annotations

import time

import pytest

from browser_support import (CHART, MAIN, SCREENSHOTS, StreamlitServer, chromium_or_skip, charts_drawn,
                             discover_pages, error_texts, launch_options, operate_first_number_input,
                             operate_first_selectbox, operate_first_slider, skip_or_fail, wait_idle)

PAGES = discover_pages()
VIEWPORT = {"width": 1400, "height": 900}
COLD_MS = 180_000   # first visit of a page: Numba may compile its kernels (tens of seconds, cold cache)
WARM_MS = 60_000    # later runs on one machine with two cores, other sessions possibly running


@pytest.fixture(scope="module")
def chromium_path():
    return chromium_or_skip()


@pytest.fixture(scope="module")
def server(chromium_path):
    with StreamlitServer() as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(chromium_path, server):
    """One Chromium for the module, after a warm-up visit of every page (compiles its kernels)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        br = pw.chromium.launch(**launch_options(chromium_path))
        ctx = br.new_context(viewport=VIEWPORT)
        page = ctx.new_page()
        for info in PAGES:
            if info.exists:
                page.goto(server.page_url(info))
                wait_idle(page, timeout_ms=COLD_MS)
        ctx.close()
        yield br
        br.close()


def _open(browser, server, info):
    ctx = browser.new_context(viewport=VIEWPORT)
    page = ctx.new_page()
    js_errors: list[str] = []
    page.on("pageerror", lambda exc: js_errors.append(str(exc)))
    page.goto(server.page_url(info))
    wait_idle(page, timeout_ms=WARM_MS)
    return ctx, page, js_errors


def _wait_charts_drawn(page, timeout_s: float = 15.0) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        total, drawn = charts_drawn(page)
        if drawn == total or time.monotonic() > deadline:
            return total, drawn
        page.wait_for_timeout(250)


def _charts_without_marks(page) -> list[int]:
    """Indices of drawn charts whose SVG holds no data mark at all (an empty plot)."""
    return page.evaluate(
        """(sel) => Array.from(document.querySelectorAll(sel)).map((c, i) => {
               const svg = c.querySelector('svg');
               if (!svg) return -1;   // canvas renderer: not inspected
               const marks = svg.querySelectorAll('g.role-mark > *');
               return marks.length > 0 ? -1 : i;
           }).filter(i => i >= 0)""", CHART)


MIN_PLOT_PX = 30   # a single chart's plot area smaller than this is squashed, not drawn


def _squashed_charts(page) -> list[str]:
    """Single (not faceted or concatenated) charts whose plot area is under MIN_PLOT_PX on a side."""
    return page.evaluate(
        """([sel, min]) => Array.from(document.querySelectorAll(sel)).flatMap((c, i) => {
               const svg = c.querySelector('svg');
               const frame = svg && svg.querySelector('path.background');
               if (!frame) return [];
               const box = frame.getBBox();    // composite charts' outer frame is 0 x 0: skipped
               if (box.width === 0 || box.height === 0) return [];
               if (box.width >= min && box.height >= min) return [];
               const title = Array.from(svg.querySelectorAll('.role-title-text')).map(t => t.textContent).join(' ');
               return [`chart ${i + 1} "${title}": plot area ${Math.round(box.width)} x ${Math.round(box.height)} px`];
           })""", [CHART, MIN_PLOT_PX])


def _failure_screenshot(page, name: str) -> None:
    """What the page showed when a check failed, for the CI log's reader."""
    try:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"FAILED_{name}.png"), full_page=True)
    except Exception:  # noqa: BLE001 - the failure itself is what matters
        pass


def _full_page_screenshot(page, path) -> None:
    """Streamlit scrolls inside its main block, so grow the viewport to the content first."""
    height = page.evaluate(
        "() => { const m = document.querySelector('[data-testid=\"stMain\"]');"
        " return m ? m.scrollHeight : document.body.scrollHeight; }")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": int(min(max(height, VIEWPORT["height"]), 12_000))})
    page.wait_for_timeout(400)  # let the charts re-lay themselves out at the new size
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(VIEWPORT)


@pytest.mark.parametrize("info", PAGES, ids=[p.name for p in PAGES])
def test_page_in_browser(info, server, browser):
    if not info.exists:
        skip_or_fail(f"{info.path} is listed in app.py but not written yet")
    ctx, page, js_errors = _open(browser, server, info)
    try:
        assert page.query_selector(f"{MAIN} h1"), f"{info.name}: no title (h1) on the page"
        assert error_texts(page) == [], f"{info.name} on load"

        operated, messages = [], []
        for name, operate in (("slider", operate_first_slider), ("selectbox", operate_first_selectbox),
                              ("number input", operate_first_number_input)):
            if not operate(page):
                continue
            operated.append(name)
            wait_idle(page, timeout_ms=WARM_MS)
            errors = error_texts(page)
            assert not [e for e in errors if "stException" in e], f"{info.name}: traceback after moving the first {name}"
            if errors:
                # The page refused the new value with a message (allowed for a value it cannot
                # take); moving the control back must clear it and redraw.
                messages.append(f"{name}: {errors}")
                operate(page, back=True)
                wait_idle(page, timeout_ms=WARM_MS)
                assert error_texts(page) == [], f"{info.name}: error stays after moving the first {name} back"
        total, drawn = _wait_charts_drawn(page)
        assert drawn == total, f"{info.name}: {total - drawn} of {total} charts not drawn"
        if info.name != "training":   # the loss chart is empty until a run starts
            assert _charts_without_marks(page) == [], f"{info.name}: empty chart(s)"
        assert _squashed_charts(page) == [], f"{info.name}: squashed chart(s)"
        assert js_errors == [], f"{info.name}: JavaScript errors {js_errors}"
        _full_page_screenshot(page, SCREENSHOTS / f"{info.name}.png")
        assert server.alive(), server.log()
        print(f"{info.name}: operated {operated or 'nothing'}, {total} chart(s); refused values: {messages or 'none'}")
    except BaseException:
        _failure_screenshot(page, info.name)
        raise
    finally:
        ctx.close()


def _loss_points(page) -> int:
    """Number of data marks in the chart whose title mentions "Loss" (-1: no such chart yet)."""
    return page.evaluate(
        """(sel) => {
               for (const c of document.querySelectorAll(sel)) {
                   const svg = c.querySelector('svg');
                   if (!svg) continue;
                   const titles = Array.from(svg.querySelectorAll('.role-title-text, .role-title text, text'))
                       .map(t => t.textContent || '');
                   if (!titles.some(t => /loss/i.test(t))) continue;
                   // a line is one path whose 'd' grows by one segment per point
                   let n = 0;
                   for (const p of svg.querySelectorAll('g.role-mark path, g.role-mark circle, g.role-mark rect')) {
                       const d = p.getAttribute('d') || '';
                       n += Math.max(1, (d.match(/L/g) || []).length + (d ? 1 : 0));
                   }
                   return n;
               }
               return -1;
           }""", CHART)


def test_training_loss_curve_grows(server, browser):
    info = next((p for p in PAGES if p.name == "training"), None)
    if info is None:
        pytest.skip("app.py lists no training page")
    if not info.exists:
        skip_or_fail(f"{info.path} is listed in app.py but not written yet")
    ctx, page, js_errors = _open(browser, server, info)
    try:
        button = page.get_by_role("button", name="Start training")
        button.click()
        # The run goes on in a worker thread; a fragment redraws the chart every so often. With an
        # empty Numba cache (a fresh CI machine) the encoder's kernels compile first.
        seen, deadline = [], time.monotonic() + 150
        while time.monotonic() < deadline:
            page.wait_for_timeout(1_000)
            points = _loss_points(page)
            seen.append(points)
            if sum(1 for a, b in zip(seen, seen[1:]) if b > a >= 0) >= 2:
                break
        grew = sum(1 for a, b in zip(seen, seen[1:]) if b > a >= 0)
        assert grew >= 2, f"the Loss chart did not grow twice in 150 s (marks seen: {seen})"
        assert error_texts(page) == []
        assert js_errors == []
        _full_page_screenshot(page, SCREENSHOTS / "training_running.png")
        assert server.alive(), server.log()
    except BaseException:
        _failure_screenshot(page, info.name)
        raise
    finally:
        ctx.close()
