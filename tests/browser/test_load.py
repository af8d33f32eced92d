"""A class at once: many browser sessions on one server.

``test_class_of_students``: one ``streamlit run app.py`` on 127.0.0.1 and one Chromium with
``SESSIONS`` browser contexts (each its own Streamlit session) driven concurrently with asyncio.
Every student types a sentence of their own on the one-head page at the same moment and must see
only their own tokens; then walks through other pages via the sidebar (between them, every page);
some open "A real model" on its default model (all-MiniLM-L6-v2) and must see its named heads, some
open it on SmolLM2-135M-Instruct by a link and must see its induction heads named; some start a training run at once (the server's training queue takes them in turn), one watches the
training page without starting and must not see the others' runs. Asserted: the server stays up,
no traceback or ``st.error`` box, no JavaScript error, each student sees only their own state, and
the server's peak resident memory (with its children) stays under ``RSS_LIMIT_MB``. Printed (and
written to ``artifacts/load_test.txt``): sessions, page visits, HTTP requests, peak RSS, the median
and 95th-percentile time of each page's redraw under that load, as the browsers saw it and as the
server ran it (its own log, ``ATTN_REDRAW_LOG``), error count. The browsers run niced below the
server (``browser_support.BROWSER_NICE``); the server runs its warm-up as a deployed one does.

``LOAD_SESSIONS`` sets the class size (10 by default, what CI runs; ``python -m bench load`` runs 30).
"""
from __future__ import annotations

import asyncio
import collections
import os
import statistics
import threading
import time
from dataclasses import dataclass, field

import pytest

from core.lessons import questions
from ui import redraw_log
from browser_support import (ARTIFACTS, CHART, ERROR_SELECTORS, IDLE_JS, MAIN, StreamlitServer, chromium_or_skip,
                             css_key, discover_pages, launch_options, skip_or_fail)

SESSIONS = int(os.environ.get("LOAD_SESSIONS", "10"))
TRAINERS = tuple(range(1, SESSIONS, 3))[:5]           # students who start a training run (5 of 30, 3 of 10)
OBSERVER = SESSIONS - 1                               # watches the training page and starts nothing
REAL_MODEL = tuple(range(2, SESSIONS, 6))[:5]         # students who open "A real model" (5 of 30, 2 of 10)
# students who open it on SmolLM2 by its link: 5 of a class of 30 (python -m bench load). CI's class of 10
# starts on an empty Numba cache, whose compiling child process shares the memory budget: none there
LANGUAGE_MODEL = tuple(range(5, SESSIONS, 6))[:5] if SESSIONS >= 30 else ()
PAGES_PER_STUDENT = 2         # sidebar visits after the one-head page
LOAD_BUDGET_S = 240 + 30 * max(0, SESSIONS - 10)      # the whole concurrent phase, hard cap
RSS_LIMIT_MB = 1024           # the server with its children, one shared copy of each model
STEP_MS = 120_000 * max(1, SESSIONS // 10)   # one page run under load, on two cores (browsers included)
VIEWPORT = {"width": 1280, "height": 900}


@dataclass
class Stats:
    visits: int = 0
    requests: int = 0
    errors: list = field(default_factory=list)
    seconds: dict = field(default_factory=lambda: collections.defaultdict(list))   # page -> each redraw


async def _wait_idle(page, timeout_ms: float = STEP_MS) -> None:
    await page.wait_for_function(IDLE_JS, timeout=timeout_ms, polling=150)
    await page.wait_for_timeout(400)
    await page.wait_for_function(IDLE_JS, timeout=timeout_ms, polling=150)


async def _error_texts(page) -> list[str]:
    texts = []
    for selector in ERROR_SELECTORS:
        for el in await page.query_selector_all(selector):
            texts.append((await el.inner_text())[:300])
    return texts


async def _chart_texts(page) -> str:
    """All text drawn inside the page's charts (axis labels carry the tokens)."""
    return await page.evaluate(
        """(sel) => Array.from(document.querySelectorAll(sel + ' svg text')).map(t => t.textContent).join(' ')""",
        CHART)


async def _check(page, who: str, where: str, stats: Stats) -> None:
    stats.visits += 1
    errors = await _error_texts(page)
    if errors:
        stats.errors.append(f"{who} on {where}: {errors}")


async def _answer_opening(page, address: str) -> None:
    """Answer the opening question of ``address`` right, as :func:`browser_support.answer_opening` does."""
    q = questions.opening(address)
    right = q.options[q.answer] if q.options else q.answer_text
    box = page.locator(css_key(f"predict_{q.key}"))
    if q.options:
        await box.locator("label").filter(has_text=right[:40]).first.click()
    else:
        await box.locator("input").fill(right)
        await box.locator("input").press("Enter")
    await _wait_idle(page)
    await page.locator(css_key(f"predict_{q.key}_check")).locator("button").click()
    await _wait_idle(page)


async def _go(page, info, who, stats) -> None:
    """Client-side navigation through the sidebar link: the session (and its state) is kept."""
    link = page.locator(f'a[data-testid="stSidebarNavLink"][href$="/{info.url_path}"]').first
    start = time.perf_counter()
    await link.click()
    await _wait_idle(page)
    stats.seconds[info.name].append(time.perf_counter() - start)
    await _check(page, who, info.name, stats)


def _sentence(i: int) -> tuple[str, str]:
    word = f"student{i}zq"
    return f"{word} reads the warm mat", word


async def _student(i, browser, server, pages, barrier, stats: Stats) -> None:
    from playwright.async_api import TimeoutError as PlaywrightTimeout

    who = f"session {i}"
    ctx = await browser.new_context(viewport=VIEWPORT)
    ctx.set_default_timeout(STEP_MS)      # a hang guard: a niced browser on a loaded machine is slow, not broken
    page = await ctx.new_page()
    page.on("request", lambda _r: setattr(stats, "requests", stats.requests + 1))
    page.on("pageerror", lambda exc: stats.errors.append(f"{who}: JavaScript error {exc}"))
    try:
        by_name = {p.name: p for p in pages}
        one_head = by_name["one_head"]
        # 1. everyone opens the one-head page and types a sentence of their own, at the same time
        await page.goto(server.page_url(one_head), timeout=STEP_MS)   # ten browsers load at once
        await _wait_idle(page)
        await _check(page, who, "one_head", stats)
        sentence, word = _sentence(i)
        box = page.locator(f'{MAIN} [data-testid="stTextInput"] input').first
        await barrier.wait()
        await box.fill(sentence)
        await box.press("Enter")
        await _wait_idle(page)
        try:   # the charts redraw a moment after the run ends (slower under load)
            await page.wait_for_function(
                """([sel, word]) => Array.from(document.querySelectorAll(sel + ' svg text'))
                                        .some(t => t.textContent.includes(word))""",
                arg=[CHART, word], timeout=STEP_MS, polling=250)
        except Exception:  # noqa: BLE001 - recorded below with what the charts show
            stats.errors.append(f"{who}: its own token {word!r} is not on its charts")
        await barrier.wait()                      # every session has typed before anyone reads
        drawn = await _chart_texts(page)
        others = [w for j in range(SESSIONS) if j != i for w in [_sentence(j)[1]] if w in drawn]
        if word not in page.url:
            stats.errors.append(f"{who}: its address {page.url} does not hold its sentence")
        if others:
            stats.errors.append(f"{who}: sees other sessions' tokens {others}")
        await _check(page, who, "one_head (typed)", stats)

        # 2. a walk through other pages, different for each student
        walk = [p for p in pages if p.name not in ("one_head", "training")]
        for k in range(PAGES_PER_STUDENT):
            await _go(page, walk[(i * PAGES_PER_STUDENT + k) % len(walk)], who, stats)
        if i in REAL_MODEL and "real_model" in by_name:       # the default real model, shared read-only
            await _go(page, by_name["real_model"], who, stats)
            await _answer_opening(page, "real_model")     # the detector shows once the question is answered
            try:                                  # its detector names the encoder's next-token head
                await page.wait_for_function(
                    """(sel) => document.querySelector(sel).innerText.includes('next-token (≥ 0.5): L2H9')""",
                    arg=MAIN, timeout=STEP_MS, polling=500)
            except Exception:  # noqa: BLE001 - recorded as the finding it is
                stats.errors.append(f"{who}: A real model does not show all-MiniLM-L6-v2's named heads")
        if i in LANGUAGE_MODEL and "real_model" in by_name:   # the real language model, by a shared link
            start = time.perf_counter()
            await page.goto(server.page_url(by_name["real_model"], "which=smollm2"), timeout=STEP_MS)
            await _wait_idle(page)
            stats.seconds["real_model (SmolLM2, by link)"].append(time.perf_counter() - start)
            await _check(page, who, "real_model (SmolLM2)", stats)
            await _answer_opening(page, "real_model")
            try:                                  # its detector names induction heads
                await page.wait_for_function(
                    """(sel) => document.querySelector(sel).innerText.includes('induction (≥')""",
                    arg=MAIN, timeout=STEP_MS, polling=500)
            except Exception:  # noqa: BLE001 - recorded as the finding it is
                stats.errors.append(f"{who}: A real model does not name SmolLM2's induction heads")

        # 3. training: some start a run, one watches without starting
        if "training" in by_name and (i in TRAINERS or i == OBSERVER):
            training = by_name["training"]
            await _go(page, training, who, stats)
            if i in TRAINERS:
                await page.get_by_role("button", name="Start training").click(timeout=STEP_MS)
                # the loss chart appears once the worker has reported a few steps
                try:
                    await page.wait_for_function(
                        """(sel) => Array.from(document.querySelectorAll(sel + ' svg text'))
                                         .some(t => /loss/i.test(t.textContent))""",
                        arg=CHART, timeout=STEP_MS, polling=500)
                except PlaywrightTimeout:        # say what the run waited on: the queue, a compile, nothing
                    bar = page.locator('[data-testid="stProgress"]')
                    said = await bar.first.inner_text() if await bar.count() else "no progress bar"
                    raise AssertionError(f"no loss chart after {STEP_MS / 1000:.0f} s; the page said: {said!r}")
                await _check(page, who, "training (running)", stats)
                pause = page.get_by_role("button", name="Pause")
                if await pause.is_enabled():
                    try:                          # leave the two cores to the others
                        await pause.click(timeout=5_000)
                    except PlaywrightTimeout:     # the run ended between the check and the click
                        pass
                    await _wait_idle(page)
            await barrier.wait()                  # trainers' runs have started
            if i == OBSERVER:
                await _go(page, by_name[pages[0].name], who, stats)
                await _go(page, training, who, stats)
                if "loss" in (await _chart_texts(page)).lower():
                    stats.errors.append(f"{who}: sees a training run it never started")
        elif "training" in by_name:
            await barrier.wait()
    except BaseException as err:
        if not isinstance(err, asyncio.BrokenBarrierError):   # the cause, not the others' wake-up
            stats.errors.append(f"{who} stopped: {type(err).__name__}: {err}")
        await barrier.abort()     # the others must not wait for this student forever
        raise
    finally:
        await ctx.close()


async def _class(chromium_path, server, pages, stats: Stats, redraws) -> float:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        browser = await pw.chromium.launch(**launch_options(chromium_path))
        # warm-up: one visit of every page compiles its kernels before the class arrives
        ctx = await browser.new_context(viewport=VIEWPORT)
        page = await ctx.new_page()
        for info in pages:
            await page.goto(server.page_url(info), timeout=STEP_MS)
            await _wait_idle(page, timeout_ms=180_000)
        await ctx.close()
        redraws.unlink(missing_ok=True)          # the server's log counts the class's page runs alone

        barrier = asyncio.Barrier(SESSIONS)
        start = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(*(_student(i, browser, server, pages, barrier, stats) for i in range(SESSIONS))),
            timeout=LOAD_BUDGET_S)
        elapsed = time.perf_counter() - start
        await browser.close()
        return elapsed


def _median_p95(times: list[float]) -> str:
    p95 = statistics.quantiles(times, n=20, method="inclusive")[-1] if len(times) > 1 else times[0]
    return f"{statistics.median(times):.2f} | {p95:.2f}"


@pytest.mark.load
def test_class_of_students():
    chromium_path = chromium_or_skip()
    pages = [p for p in discover_pages() if p.exists]
    if "one_head" not in {p.name for p in pages}:
        skip_or_fail("the one-head page (views/one_head.py) is needed for the isolation check")
    stats = Stats()
    redraws = ARTIFACTS / "load_test_redraws.tsv"        # the server's own time per page run
    ARTIFACTS.mkdir(exist_ok=True)
    redraws.unlink(missing_ok=True)
    with StreamlitServer(extra_env={"ATTN_REDRAW_LOG": str(redraws)}) as server:
        idle_rss_mb = server.sample_rss() / 1024
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                server.sample_rss()
                stop.wait(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            elapsed = asyncio.run(_class(chromium_path, server, pages, stats, redraws))
        except Exception as err:
            pytest.fail(f"the class did not finish ({type(err).__name__}); the sessions reported:\n  "
                        + "\n  ".join(stats.errors) + f"\nserver log (end):\n{server.log()[-3000:]}")
        finally:
            stop.set()
            sampler.join()
        alive = server.alive()
        peak_mb = server.sample_rss() / 1024
        log = server.log()
    report = (f"load test: {SESSIONS} concurrent sessions ({len(TRAINERS)} training, {len(REAL_MODEL)} on A real "
              f"model's MiniLM, {len(LANGUAGE_MODEL)} on its SmolLM2), {stats.visits} page visits, {stats.requests} HTTP requests in {elapsed:.1f} s; "
              f"server RSS idle {idle_rss_mb:.0f} MB, peak {peak_mb:.0f} MB (VmHWM, server + children); "
              f"errors: {len(stats.errors)}")
    server_runs = redraw_log.read(str(redraws)) if redraws.exists() else {}
    report += ("\n| page | sidebar visits | redraw seen by the browser: median (s) | 95th percentile (s) | "
               "the server's own runs of the page | median (s) | 95th percentile (s) |\n|---|---|---|---|---|---|---|")
    for name, times in sorted(stats.seconds.items()):
        own = server_runs.get(name, [])
        report += (f"\n| {name} | {len(times)} | {_median_p95(times)} | {len(own)} | "
                   f"{_median_p95(own) if own else '– | –'} |")
    report += "".join(f"\n  {err}" for err in stats.errors)
    print("\n" + report)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / "load_test.txt").write_text(report + "\n", encoding="utf-8")
    assert alive, f"the server died under load:\n{log}"
    assert stats.errors == []
    assert stats.visits >= SESSIONS * (2 + PAGES_PER_STUDENT)
    assert set(stats.seconds) >= {p.name for p in pages} - {"one_head"}, "some page was never visited"
    assert peak_mb < RSS_LIMIT_MB, f"the server's peak resident memory {peak_mb:.0f} MB"
