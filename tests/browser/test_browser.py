"""Every page of the dashboard in a real browser (Debian's Chromium driven by Playwright).

One ``streamlit run app.py`` server on 127.0.0.1 serves the module. Each page listed in ``app.py``
(read from the file, so pages added later are covered) is opened by its URL path, left to finish
its script run, has its first slider / selectbox / number input operated, and must show no
traceback and no ``st.error`` box, with every chart drawn (an SVG with data marks, a plot area at
least ``MIN_PLOT_PX`` on a side). A full-page screenshot of each page goes
to ``artifacts/screenshots/<page>.png``. The training page also starts a run and must draw one loss
point per step by the end of it.

Two checks need more than the shared server:

- a shared link opened first on a freshly started server must still go through the router
  (``app.py``): its own server, whose first visit is ``/one_head?seed=3``;
- every page follows the browser's light or dark preference, and every chart reads on it: bars,
  lines, points and rules at least 3:1 against the background, numbers in heatmap cells at least
  4.5:1 against their cell. Screenshots: ``artifacts/screenshots/<page>_<light|dark>.png``.

Without Chromium or the ``playwright`` package the module is skipped with the reason, except under
``REQUIRE_BROWSER=1`` (CI), where that is a failure.
"""
from __future__ import annotations

import re
import time
from urllib.parse import parse_qs, urlparse

import pytest

from browser_support import (CHART, MAIN, SCREENSHOTS, StreamlitServer, answer_opening, app_background,
                             chart_colours, chromium_or_skip, charts_drawn, contrast_ratio, discover_pages, error_texts,
                             failure_screenshot, follow_run, launch_options, operate_first_number_input,
                             operate_first_selectbox, operate_first_slider, over, relative_luminance, skip_or_fail,
                             wait_idle)

PAGES = discover_pages()
VIEWPORT = {"width": 1400, "height": 900}
COLD_MS = 180_000   # first visit of a page: Numba may compile its kernels (tens of seconds, cold cache)
WARM_MS = 60_000    # later runs on one machine with two cores, other sessions possibly running


@pytest.fixture(scope="module")
def chromium_path():
    return chromium_or_skip()


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


def _open(browser, server, info, *, query: str = "", color_scheme: str = "light", timeout_ms: float = WARM_MS,
          answered: bool = True):
    """A new browser session on ``info``'s page; ``answered``: its opening question answered right
    first, as a student who has (the control it locks opens)."""
    ctx = browser.new_context(viewport=VIEWPORT, color_scheme=color_scheme)
    page = ctx.new_page()
    js_errors: list[str] = []
    page.on("pageerror", lambda exc: js_errors.append(str(exc)))
    page.goto(server.page_url(info, query))
    wait_idle(page, timeout_ms=timeout_ms)
    if answered:
        answer_opening(page, info.name, timeout_ms)
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
        failure_screenshot(page, info.name)
        raise
    finally:
        ctx.close()


def _loss_points(page) -> int:
    """Number of points of the line in the chart whose title mentions "Loss" (-1: no such chart yet)."""
    return page.evaluate(
        """(sel) => {
               for (const c of document.querySelectorAll(sel)) {
                   const svg = c.querySelector('svg');
                   if (!svg) continue;
                   const titles = Array.from(svg.querySelectorAll('g.role-title-text > text')).map(t => t.textContent || '');
                   if (!titles.some(t => /loss/i.test(t))) continue;
                   // one path per line: a move to the first point, then one segment per further point
                   let n = 0;
                   for (const p of svg.querySelectorAll('g.role-mark > [aria-roledescription="line mark"]')) {
                       const d = p.getAttribute('d') || '';
                       n += d ? (d.match(/L/g) || []).length + 1 : 0;
                   }
                   return n;
               }
               return -1;
           }""", CHART)


PROGRESS = re.compile(r"(\w+): step (\d+) of (\d+)")


def _progress(page) -> tuple[str, int, int] | None:
    """(status, step, target) from the training progress bar's text, or None before a run."""
    bars = page.query_selector_all('[data-testid="stProgress"]')
    match = PROGRESS.search(bars[0].inner_text()) if bars else None
    return (match[1], int(match[2]), int(match[3])) if match else None


def _train_to_the_end(page) -> list[tuple[str, int, int]]:
    """Press "Start training" and follow the progress bar until the run ends: every progress seen
    (see :func:`browser_support.follow_run`: it ends on what the page shows, never on a clock)."""
    return follow_run(page, _progress, page.get_by_role("button", name="Start training").click)


def test_training_loss_curve_grows(server, browser):
    """A run drawn live: the loss curve holds one point per step the progress bar reports.

    Waits on what the page shows (the step counter reaching its target, then the curve's points),
    never on how many redraws happen to fall inside the run: a fast machine ends the default run
    between two redraws.
    """
    info = next((p for p in PAGES if p.name == "training"), None)
    if info is None:
        pytest.skip("app.py lists no training page")
    if not info.exists:
        skip_or_fail(f"{info.path} is listed in app.py but not written yet")
    ctx, page, js_errors = _open(browser, server, info, query="steps=300")
    try:
        assert _progress(page) is None, "a progress bar before any run"
        # 1. the run ends: at its target, or, on a machine too busy to train 300 steps within the
        #    60 s cap (the readable step while the warm-up still compiles the other), at the time cap,
        #    which the page then names. Either is a correct end; the curve is checked against it.
        seen = _train_to_the_end(page)
        wait_idle(page, timeout_ms=WARM_MS)       # the whole page redraws once after a run
        status, step, target = seen[-1]
        capped = 0 < step < target and "time cap" in page.inner_text(MAIN)
        assert status == "done" and (step == target or capped), f"the run ended as {seen[-1]} (progress seen: {seen})"
        steps_seen = [s for _, s, _ in seen]
        assert steps_seen == sorted(steps_seen), f"the step counter went back: {seen}"
        # 2. the curve holds every step's loss (the page thins it only beyond 400 points)
        assert _loss_points(page) == step, f"the Loss chart draws {_loss_points(page)} points after {step} steps"
        assert error_texts(page) == []
        assert js_errors == []
        _full_page_screenshot(page, SCREENSHOTS / "training_running.png")
        assert server.alive(), server.log()
    except BaseException:
        failure_screenshot(page, info.name)
        raise
    finally:
        ctx.close()


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_real_model_names_the_encoders_heads_and_a_removed_head_moves_the_similarity(scheme, server, browser):
    """The page's default, all-MiniLM-L6-v2: the detector names head L1H3 (previous token) and head L2H9
    (next token), the cosine matrix is drawn, and removing another head moves the largest change."""
    info = next(p for p in PAGES if p.name == "real_model")
    ctx, page, js_errors = _open(browser, server, info, color_scheme=scheme, timeout_ms=COLD_MS)
    try:
        text = page.inner_text(MAIN)
        assert re.search(r"previous-token \(≥ 0.5\): L1H3 1.00", text), text[:2000]
        assert re.search(r"next-token \(≥ 0.5\): L2H9 0\.\d\d", text)
        cosines = page.locator(CHART, has_text="Cosine similarity").first.text_content()
        assert all(cell in cosines for cell in ("0.67", "0.10", "0.14")), cosines   # the published .6660 .1046 .1411
        change = lambda: page.locator('[data-testid="stMetric"]', has_text="largest change in a similarity")  # noqa: E731
        before = change().locator('[data-testid="stMetricValue"]').inner_text()
        assert operate_first_number_input(page)                      # the layer: 1 -> 2
        wait_idle(page, timeout_ms=WARM_MS)
        after = change().locator('[data-testid="stMetricValue"]').inner_text()
        assert float(after) > 0 and after != before, (before, after)
        assert charts_drawn(page)[0] >= 10 and error_texts(page) == [] and js_errors == []
        _full_page_screenshot(page, SCREENSHOTS / f"real_model_minilm_{scheme}.png")
    except BaseException:
        failure_screenshot(page, f"real_model_minilm_{scheme}")
        raise
    finally:
        ctx.close()


# --- a link opened first on a fresh server ---------------------------------------------------------


def test_deep_link_first_on_fresh_server(browser):
    """The first visit of a freshly started server is a shared link, not ``/``: the router still runs.

    The pages live in ``views/``: a folder named ``pages/`` would put Streamlit in its older
    multipage mode on a fresh server (file names in the sidebar, ``app.py`` skipped).
    """
    info = next((p for p in PAGES if p.name == "one_head"), None)
    if info is None or not info.exists:
        skip_or_fail("app.py lists no one_head page, or its file is not written yet")
    with StreamlitServer() as fresh:
        ctx, page, js_errors = _open(browser, fresh, info, query="seed=3", timeout_ms=COLD_MS)
        try:
            sidebar = page.locator('[data-testid="stSidebar"]')
            # 1. the router's sidebar: its page titles, not the files' names, and its two controls
            links = [t.split("\n")[-1].strip() for t in sidebar.locator('[data-testid="stSidebarNavLink"]').all_inner_texts()]
            assert links == [p.title for p in PAGES], f"sidebar links {links}"
            assert sidebar.locator('[data-testid="stSelectbox"]', has_text="Backend").count() == 1
            assert sidebar.locator('[data-testid="stRadio"]', has_text="Precision").count() == 1
            assert "Running on:" in sidebar.inner_text()
            # 2. the page the link names, with the link's settings
            assert page.locator(f"{MAIN} h1").first.inner_text().startswith("One head")
            assert page.get_by_label("Random seed").input_value() == "3"
            assert parse_qs(urlparse(page.url).query).get("seed") == ["3"], page.url
            assert error_texts(page) == [] and js_errors == []
            assert fresh.alive(), fresh.log()
        except BaseException:
            failure_screenshot(page, "deep_link_first")
            raise
        finally:
            ctx.close()


# --- light and dark -------------------------------------------------------------------------------

SCHEMES = ("light", "dark")
SERIES_MIN_CONTRAST = 3.0   # WCAG 2.1 non-text contrast: bars, lines, points, rules
NOTE_MIN_CONTRAST = 4.5     # WCAG 2.1 text contrast: the numbers written in heatmap cells
# Axis and legend text take Streamlit's own theme colours (light: #808495 on white, 3.8:1): they
# must not fade into the background, at the large-text level.
CHART_TEXT_MIN_CONTRAST = 3.0


def _colour(rgba) -> str:
    return "#{:02x}{:02x}{:02x}".format(*(round(c) for c in rgba[:3]))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("info", PAGES, ids=[p.name for p in PAGES])
def test_theme_follows_browser(info, scheme, server, browser):
    """With the browser set to light or dark, the page is light or dark, and every chart reads on it."""
    if not info.exists:
        skip_or_fail(f"{info.path} is listed in app.py but not written yet")
    ctx, page, js_errors = _open(browser, server, info, color_scheme=scheme)
    try:
        # 1. the app's background follows the browser's preference
        background = app_background(page)
        luminance = relative_luminance(background)
        if scheme == "dark":
            assert luminance < 0.1, f"{info.name}: background {_colour(background)} with the browser set to dark"
        else:
            assert luminance > 0.8, f"{info.name}: background {_colour(background)} with the browser set to light"
        # 2. every mark, number and label of every chart stands out from what it is drawn on
        total, drawn = _wait_charts_drawn(page)
        assert drawn == total, f"{info.name}: {total - drawn} of {total} charts not drawn"
        faint, checked = [], 0
        for i, chart in enumerate(chart_colours(page), start=1):
            for kind, rgba in chart["series"]:
                checked += 1
                ratio = contrast_ratio(over(rgba, background), background)
                if ratio < SERIES_MIN_CONTRAST:
                    faint.append(f"chart {i}: {kind} {_colour(rgba)} on {_colour(background)}: {ratio:.2f}:1")
            for text, rgba, cell in chart["notes"]:
                checked += 1
                cell_rgb = over(cell, background)
                ratio = contrast_ratio(over(rgba, cell_rgb), cell_rgb)
                if ratio < NOTE_MIN_CONTRAST:
                    faint.append(f"chart {i}: number {text!r} {_colour(rgba)} on its cell {_colour(cell_rgb)}: {ratio:.2f}:1")
            for text, rgba in chart["texts"]:
                checked += 1
                ratio = contrast_ratio(over(rgba, background), background)
                if ratio < CHART_TEXT_MIN_CONTRAST:
                    faint.append(f"chart {i}: label {text!r} {_colour(rgba)} on {_colour(background)}: {ratio:.2f}:1")
        assert total == 0 or checked > 0, f"{info.name}: {total} charts but no mark found to check"
        assert faint == [], f"{info.name} ({scheme}): {len(faint)} faint of {checked}: " + "; ".join(sorted(set(faint))[:12])
        assert js_errors == []
        _full_page_screenshot(page, SCREENSHOTS / f"{info.name}_{scheme}.png")
        print(f"{info.name} ({scheme}): background {_colour(background)}, {total} chart(s), {checked} colours checked")
    except BaseException:
        failure_screenshot(page, f"{info.name}_{scheme}")
        raise
    finally:
        ctx.close()
