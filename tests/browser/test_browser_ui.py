"""What a student sees, checked in a real browser where AppTest cannot see it.

One server, started for this module with Streamlit's own file watcher on (as ``streamlit run
app.py`` has it on a student's machine; the other browser tests turn it off). Its first visit is
a shared link, so the first test sees a freshly started server.

- a deep link opened first never shows a raw file name in the sidebar, at any moment;
- files written into ``__pycache__`` folders of the app's packages (what Numba does when a kernel
  compiles) never bring up Streamlit's "File change — Rerun" notice;
- a page that stops on bad input keeps every control's value, on screen and in the link;
- a source expander is empty until opened, then filled, and stays so as the page runs again;
- a refused matrix cell is cleared back to the value the charts use, with a message in the
  student's words; labels are read-only;
- heatmaps label every key that fits; nothing is cut off (charts, formulas, tables, dropdowns).
"""
from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from browser_support import (MAIN, ROOT, StreamlitServer, answer_opening, chromium_or_skip, discover_pages,
                             error_texts, failure_screenshot, launch_options, wait_idle)

PAGES = {p.name: p for p in discover_pages()}
VIEWPORT = {"width": 1400, "height": 900}
COLD_MS = 240_000   # a first visit may compile the page's kernels (tens of seconds on two cores)
WARM_MS = 60_000


@pytest.fixture(scope="module")
def chromium_path():
    return chromium_or_skip()


@pytest.fixture(scope="module")
def server(chromium_path):
    with StreamlitServer(watch_files=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser(chromium_path, server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        br = pw.chromium.launch(**launch_options(chromium_path))
        yield br
        br.close()


def _page(browser, color_scheme: str = "light"):
    ctx = browser.new_context(viewport=VIEWPORT, color_scheme=color_scheme)
    return ctx, ctx.new_page()


def _open(browser, server, name: str, query: str = "", timeout_ms: float = COLD_MS, answered: bool = True):
    """A new browser session on page ``name``; ``answered``: its opening question answered right first
    (the control it locks opens)."""
    ctx, page = _page(browser)
    page.goto(server.page_url(PAGES[name], query))
    wait_idle(page, timeout_ms=timeout_ms)
    if answered:
        answer_opening(page, name, timeout_ms)
    return ctx, page


def _query(page) -> dict:
    return {k: v[-1] for k, v in parse_qs(urlparse(page.url).query).items()}


# --- 9. a deep link first: the sidebar never lists file names ---------------------------------------

NAV_LINKS_JS = """() => Array.from(document.querySelectorAll('[data-testid="stSidebarNavLink"]'))
                     .map(a => a.innerText.split('\\n').pop().trim())"""


def test_deep_link_first_never_shows_file_names(server, browser):
    """From the first paint of a link opened first on a fresh server until the page has run,
    every sidebar link reads as its page title; a file-derived name ("one head", "app") never shows."""
    titles = [p.title for p in PAGES.values()]
    file_names = {Path(p.path).stem.replace("_", " ") for p in PAGES.values()} | {"app", "streamlit app"}
    ctx, page = _page(browser)
    try:
        page.goto(server.page_url(PAGES["one_head"], "seed=3"), wait_until="commit")
        seen, deadline = [], time.monotonic() + COLD_MS / 1000
        while time.monotonic() < deadline:
            links = page.evaluate(NAV_LINKS_JS)
            if links and (not seen or seen[-1] != links):
                seen.append(links)
            if page.evaluate("""() => document.querySelector('[data-testid="stApp"]')
                                     ?.getAttribute('data-test-script-state') === 'notRunning'""") \
                    and page.locator(f"{MAIN} h1").count():
                break
            page.wait_for_timeout(30)
        wait_idle(page, timeout_ms=COLD_MS)
        seen.append(page.evaluate(NAV_LINKS_JS))
        raw = sorted({name for links in seen for name in links if name in file_names})
        assert raw == [], f"file names in the sidebar at some moment: {raw} (all seen: {seen})"
        assert all(links == titles for links in seen if links), f"sidebar links seen: {seen}"
        assert page.get_by_label("Random seed").input_value() == "3"
    except BaseException:
        failure_screenshot(page, "deep_link_sidebar")
        raise
    finally:
        ctx.close()


# --- 2. a kernel compiling never brings up "File change" --------------------------------------------

CACHE_FOLDERS = ("core/kernels/tuned/__pycache__", "core/kernels/__pycache__", "core/lessons/__pycache__",
                 "core/__pycache__", "ui/__pycache__", "core/model/__pycache__")


def _file_change_notice(page) -> str:
    """The text of Streamlit's "File change" notice in the header, or "" when it is not shown."""
    return page.evaluate("""() => {
        const box = document.querySelector('[data-testid="stStatusWidget"]');
        const text = box ? box.innerText : '';
        return /file change|rerun/i.test(text) ? text : '';
    }""")


def test_cache_files_written_while_running_bring_no_file_change_notice(server, browser):
    """Numba writes its cache (``*.nbi``, ``*.nbc``) into ``__pycache__`` beside the kernels when one
    compiles; Python writes ``*.pyc`` there on a first import. Neither may look like an edit of the app."""
    ctx, page = _open(browser, server, "one_head")
    written = []
    try:
        assert _file_change_notice(page) == ""
        stamp = f"{time.time_ns()}"
        for folder in CACHE_FOLDERS:
            path = ROOT / folder
            path.mkdir(exist_ok=True)
            for suffix in (".nbi", ".nbc", ".cpython-311.pyc"):
                probe = path / f"browser_probe_{stamp}{suffix}"
                probe.write_bytes(b"written by the browser test, as a compiling kernel writes its cache")
                written.append(probe)
        deadline = time.monotonic() + 6      # the watcher reacts within a second; give it several
        while time.monotonic() < deadline:
            notice = _file_change_notice(page)
            assert notice == "", f"a cache file written under {CACHE_FOLDERS} showed: {notice!r}"
            page.wait_for_timeout(250)
        assert server.alive(), server.log()
    except BaseException:
        failure_screenshot(page, "file_change_notice")
        raise
    finally:
        for probe in written:
            probe.unlink(missing_ok=True)
        ctx.close()


# --- 1. a page that stops on bad input keeps its controls ------------------------------------------


def _type_into(page, label: str, text: str) -> None:
    box = page.get_by_label(label)
    box.fill(text)
    box.press("Enter")
    wait_idle(page, timeout_ms=WARM_MS)


def _one_head_controls(page) -> dict:
    main = page.locator(MAIN)
    return {
        "d_k": main.get_by_role("spinbutton", name="d_k (width of a query or key)").input_value(),
        "seed": main.get_by_label("Random seed").input_value(),
        "temperature": main.locator('[data-testid="stSlider"]', has_text="Temperature")
                           .get_by_test_id("stSliderThumbValue").inner_text(),
        "scaled": main.locator("label", has_text="Divide by √d_k").locator("input").is_checked(),
        "causal": main.locator("label", has_text="Causal mask (no looking").locator("input").is_checked(),
    }


def test_one_head_keeps_its_controls_after_an_empty_sentence(server, browser):
    """d_k = 4, τ = 1, √d_k on, causal on; clear the sentence (the page stops with a message), type a
    valid one: every control still shows its value, and the link keeps it after the next change."""
    ctx, page = _open(browser, server, "one_head")
    sentence = "Sentence (at most 16 words; each word is one token)"
    try:
        d_k = page.locator(f'{MAIN} [data-testid="stNumberInput"]', has_text="d_k (width")
        for _ in range(2):                                        # 2 -> 4 with the "+" button
            d_k.get_by_test_id("stNumberInputStepUp").click()
            wait_idle(page, timeout_ms=WARM_MS)
        before = _one_head_controls(page)
        assert before == {"d_k": "4", "seed": "0", "temperature": "1.00", "scaled": True, "causal": True}, before
        assert _query(page).get("d_k") == "4"

        _type_into(page, sentence, "")
        assert any("empty" in e for e in error_texts(page)), error_texts(page)
        _type_into(page, sentence, "the cat sat on the mat")
        assert error_texts(page) == []
        assert _one_head_controls(page) == before, "controls changed after an empty sentence"

        # the next change writes the link from the controls on screen: d_k stays 4, nothing else moves
        page.locator(f'{MAIN} [data-testid="stNumberInput"]', has_text="Random seed") \
            .get_by_test_id("stNumberInputStepUp").click()
        wait_idle(page, timeout_ms=WARM_MS)
        assert _one_head_controls(page) == {**before, "seed": "1"}
        link = _query(page)
        assert link.get("d_k") == "4" and link.get("seed") == "1", link
        assert not {"scaled", "causal", "temperature"} & set(link), link
    except BaseException:
        failure_screenshot(page, "one_head_bad_sentence")
        raise
    finally:
        ctx.close()


def test_a_source_expander_is_filled_once_opened_and_stays_open(server, browser):
    """Masks draws its three source expanders shut and empty (no code block, so no syntax
    highlighter on a first visit); opening the last reruns the page and fills that one alone, and
    it stays open and filled when the page runs again for a new input."""
    ctx, page = _open(browser, server, "masks")
    code = '[data-testid="stCode"]'
    try:
        boxes = page.locator(f'{MAIN} [data-testid="stExpander"]', has_text="Kernel source")
        assert boxes.count() == 3 and page.locator(code).count() == 0
        boxes.nth(2).locator("summary").click()
        page.wait_for_function(f"() => document.querySelectorAll('{code}').length > 0", timeout=WARM_MS)
        wait_idle(page, timeout_ms=WARM_MS)
        filled = [boxes.nth(i).locator(code).count() for i in range(3)]
        assert filled[2] > 0 and filled[:2] == [0, 0], filled
        _type_into(page, "Target so far (decoder side)", "i am a teacher")
        assert error_texts(page) == [] and "teacher" in page.locator(MAIN).inner_text()
        assert [boxes.nth(i).locator(code).count() for i in range(3)] == filled
    except BaseException:
        failure_screenshot(page, "masks_source_expander")
        raise
    finally:
        ctx.close()


def test_parameters_keeps_its_controls_after_heads_that_do_not_divide(server, browser):
    """7 heads do not divide d_model = 64: the page stops with a message; back to 8, the controls
    drawn below the message (the whole-model choices) still hold what the student set."""
    ctx, page = _open(browser, server, "parameters")
    try:
        main = page.locator(MAIN)
        main.get_by_role("radiogroup", name="Architecture").get_by_text("decoder-only").click()
        wait_idle(page, timeout_ms=WARM_MS)
        heads = main.locator('[data-testid="stNumberInput"]', has_text="Heads H")
        heads.get_by_test_id("stNumberInputStepDown").click()      # 8 -> 7
        wait_idle(page, timeout_ms=WARM_MS)
        assert any("cannot be split evenly" in e for e in error_texts(page))
        heads.get_by_test_id("stNumberInputStepUp").click()        # 7 -> 8
        wait_idle(page, timeout_ms=WARM_MS)
        assert error_texts(page) == []
        assert main.get_by_role("radiogroup", name="Architecture") \
            .get_by_role("radio", name="decoder-only").is_checked()
    except BaseException:
        failure_screenshot(page, "parameters_bad_heads")
        raise
    finally:
        ctx.close()


# --- 7. matrix cells: what a cell shows is what is used ---------------------------------------------

CELLS_JS = """(i) => Array.from(document.querySelectorAll('[data-testid="stDataFrame"]')[i]
                 .querySelectorAll('table td')).map(td => [td.textContent, td.getAttribute('aria-readonly')])"""


def _type_in_cell(page, editor_index: int, row: int, column: int, text: str) -> None:
    """Select cell (row, column) of a data editor (the label column is 0), enter ``text``, press Enter.

    The cell's editor (an input of class ``gdg-input``) opens a moment after Enter, and on a busy
    machine keys typed within a fixed wait went to the page instead. So wait for the editor itself,
    fill it, check that it holds ``text``, and start again from selecting the cell if it does not."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout   # only where a browser runs

    for _ in range(3):
        grid = page.locator('[data-testid="stDataFrame"]').nth(editor_index)
        grid.scroll_into_view_if_needed()                              # clicks land on screen only
        box = grid.bounding_box()
        page.mouse.click(box["x"] + 15, box["y"] + 35 + 35 * row + 17)   # the row's label cell
        for _ in range(column):
            page.keyboard.press("ArrowRight")
        page.keyboard.press("Enter")                                   # open the cell's editor
        editor = page.locator(".gdg-input").first
        try:
            editor.wait_for(state="visible", timeout=5_000)
            editor.fill(text)
            if editor.input_value() == text:
                break
        except PlaywrightTimeout:
            pass
        page.keyboard.press("Escape")
    else:
        raise AssertionError(f"could not enter {text!r} in cell ({row}, {column})")
    editor.press("Enter")
    wait_idle(page, timeout_ms=WARM_MS)
    # a refused cell redraws the editor afresh: wait for all its cells to be there again
    page.wait_for_function("""() => document.querySelectorAll('[data-testid="stDataFrame"]').length > 1 &&
        document.querySelectorAll('[data-testid="stDataFrame"]')[0].querySelectorAll('table td').length >= 9""",
                           timeout=WARM_MS, polling=100)


def _eventually(check, timeout_s: float = 30.0) -> bool:
    """Whether ``check()`` comes true within ``timeout_s``. The grid's cells and the warnings are
    drawn a moment after the rerun that an edited cell starts, and reading them at once raced it."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _first_q(page) -> str:
    """Row 2, column f1 of Q as the link holds it."""
    return _query(page).get("Q", "").split(";")[1].split(",")[0]


def _warnings(page) -> list[str]:
    return [w.inner_text() for w in page.query_selector_all('[data-testid="stAlertContentWarning"]')]


@pytest.mark.parametrize("typed, words", [("1e308", "1e+308, beyond the limit of ±1,000"), ("NaN", "NaN")])
def test_matrix_cells_show_what_is_used(typed, words, server, browser):
    """One head, queries typed by hand: a good cell is used as typed; 1e308 (not 1308) and NaN (not
    0) are refused with a message naming Q, the token and the column, and the cell goes back to the
    value in use; the token column is read-only."""
    ctx, page = _open(browser, server, "one_head", "source=hand&sentence=The+cat+sat")
    try:
        page.wait_for_selector('[data-testid="stDataFrame"] table td', state="attached", timeout=WARM_MS)
        cells = page.evaluate(CELLS_JS, 0)                     # Q: [token, f1, f2] per row
        assert [c[0] for c in cells[::3]] == ["1 The", "2 cat", "3 sat"]
        assert {c[1] for c in cells[::3]} == {"true"} and {c[1] for c in cells[1::3]} == {"false"}

        _type_in_cell(page, 0, 1, 1, "2.5e2")                 # row 2, f1: a good value, used as typed
        assert _eventually(lambda: page.evaluate(CELLS_JS, 0)[4][0] == "2.5e2"), page.evaluate(CELLS_JS, 0)
        assert _eventually(lambda: _first_q(page) == "250"), _query(page)
        good = page.evaluate(CELLS_JS, 0)
        good[4][0] = "250"                                      # a fresh editor writes it as it reads it

        _type_in_cell(page, 0, 1, 1, typed)
        refused = lambda m: words in m and "Q, row “2 cat”, column f1" in m     # noqa: E731
        assert _eventually(lambda: any(refused(m) for m in _warnings(page))), _warnings(page)
        assert not any("one_head." in m for m in _warnings(page)), _warnings(page)
        assert _eventually(lambda: page.evaluate(CELLS_JS, 0) == good), f"the refused {typed!r} stays in the cell"
        assert _first_q(page) == "250"
        assert error_texts(page) == []
    except BaseException:
        failure_screenshot(page, "matrix_cells")
        raise
    finally:
        ctx.close()


# --- 10. layout: every label that fits, nothing cut off ---------------------------------------------

AXIS_LABELS_JS = """() => Array.from(document.querySelectorAll('[data-testid="stVegaLiteChart"] svg')).map(svg => ({
    title: Array.from(svg.querySelectorAll('g.role-title-text > text')).map(t => t.textContent).join(' '),
    shown: Array.from(svg.querySelectorAll('g.role-axis-label > text'))
                .filter(t => parseFloat(t.getAttribute('opacity') ?? '1') > 0).map(t => t.textContent)}))"""


def test_heatmaps_label_every_key(server, browser):
    """Cross-attention over "je suis étudiant": each of the 3 keys is labelled under its column, and
    each of the 4 queries beside its row (Vega's overlap rule used to hide every other one)."""
    ctx, page = _open(browser, server, "masks")
    try:
        charts = page.evaluate(AXIS_LABELS_JS)
        cross = [c for c in charts if "1 je" in " ".join(c["shown"]) or "2 suis" in " ".join(c["shown"])]
        assert cross, f"no chart labels a source word: {charts}"
        for label in ("1 je", "2 suis", "3 étudiant", "1 i", "2 am", "3 a", "4 student"):
            assert all(label in c["shown"] for c in cross), f"{label!r} not shown: {cross}"
        causal = [c for c in charts if "2 tired" in c["shown"] or "1 the" in c["shown"]]
        assert causal and all(f"{i + 1} {w}" in c["shown"] for c in causal
                              for i, w in enumerate("the tired cat sat on the warm mat".split())), causal
    except BaseException:
        failure_screenshot(page, "heatmap_labels")
        raise
    finally:
        ctx.close()


CUT_OFF_JS = """() => {
    const main = document.querySelector('[data-testid="stMainBlockContainer"]').getBoundingClientRect();
    const found = [];
    // a chart wider than the page, or a title or label Vega shortened with an ellipsis
    document.querySelectorAll('[data-testid="stVegaLiteChart"] svg').forEach((svg, i) => {
        const r = svg.getBoundingClientRect();
        const title = Array.from(svg.querySelectorAll('g.role-title-text > text')).map(t => t.textContent).join(' ');
        if (r.right > main.right + 1) found.push(`chart ${i + 1} "${title}" runs ${Math.round(r.right - main.right)} px past the page`);
        svg.querySelectorAll('text').forEach(t => {
            if ((t.textContent || '').endsWith('…')) found.push(`chart ${i + 1} "${title}": text cut to "${t.textContent}"`);
        });
        // the legend must be on screen too
        svg.querySelectorAll('g.role-legend').forEach(g => {
            if (g.getBoundingClientRect().right > main.right + 1) found.push(`chart ${i + 1} "${title}": legend off the page`);
        });
    });
    // a formula wider than its box (KaTeX scrolls it sideways: the end is hidden)
    document.querySelectorAll('[data-testid="stMain"] .katex-display').forEach(k => {
        const box = k.getBoundingClientRect(), html = k.querySelector('.katex-html');
        const r = html ? html.getBoundingClientRect() : box;
        if (r.right > box.right + 2 || r.left < box.left - 2)
            found.push(`formula cut off: ${(k.querySelector('annotation') || k).textContent.slice(0, 80)}`);
    });
    // a static table's cell, or a dropdown's shown choice, shortened
    document.querySelectorAll('[data-testid="stMain"] [data-testid="stTable"] td, [data-testid="stMain"] [data-testid="stTable"] th').forEach(c => {
        if (c.scrollWidth > c.clientWidth + 1) found.push(`table cell cut off: ${c.innerText.slice(0, 60)}`);
    });
    document.querySelectorAll('[data-testid="stMain"] [data-testid="stSelectbox"] [data-baseweb="select"] div').forEach(d => {
        if (getComputedStyle(d).textOverflow === 'ellipsis' && d.scrollWidth > d.clientWidth + 1)
            found.push(`dropdown choice cut off: ${d.innerText.slice(0, 60)}`);
    });
    return found;
}"""


@pytest.mark.parametrize("name, query", [
    ("positional", ""), ("masks", ""), ("parameters", ""), ("filter_bank", ""), ("one_head", ""),
    ("multi_head", ""), ("check_yourself", ""), ("home", ""),
])
def test_nothing_is_cut_off(name, query, server, browser):
    """At 1,400 px: no chart (or its legend) runs past the page, no chart text is shortened to "…",
    no formula, table cell or dropdown choice is cut off."""
    ctx, page = _open(browser, server, name, query)
    try:
        page.wait_for_timeout(1500)          # charts lay themselves out after the run
        assert page.evaluate(CUT_OFF_JS) == []
    except BaseException:
        failure_screenshot(page, f"cut_off_{name}")
        raise
    finally:
        ctx.close()
