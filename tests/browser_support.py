"""Shared helpers for the page, browser and load tests.

- ``discover_pages()`` reads the page list out of ``app.py`` (its ``st.Page(...)`` calls) without
  running Streamlit, so a page added to the router later is tested without touching the tests.
- ``StreamlitServer`` starts ``streamlit run`` on 127.0.0.1 (a free port) as a subprocess, waits for
  ``/_stcore/health`` and reads the server's memory from ``/proc``.
- ``chromium_or_skip()`` finds Debian's Chromium and the ``playwright`` package, or skips with a
  reason; with ``REQUIRE_BROWSER=1`` (set by ``.ci/run``) a missing browser is a failure instead.
- DOM helpers: wait for a script run to end, collect error boxes, operate the first controls.
- Colour helpers: the app's background and the colours the charts draw, and the WCAG contrast
  ratio between two colours, to check that nothing fades into a light or a dark background.

Streamlit's DOM hooks used here (Streamlit >= 1.45): ``[data-testid="stApp"]`` carries
``data-test-script-state`` (``running`` / ``notRunning``); errors are ``stException`` (a traceback)
and ``stAlertContentError`` (``st.error``); Altair charts are ``stVegaLiteChart``.
"""
from __future__ import annotations

import ast
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app.py"
ARTIFACTS = ROOT / "artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# CI (.ci/run) sets this: there a missing browser or a missing page fails instead of skipping.
STRICT = os.environ.get("REQUIRE_BROWSER") == "1"

ERROR_SELECTORS = ('[data-testid="stException"]', '[data-testid="stAlertContentError"]')
MAIN = '[data-testid="stMain"]'
CHART = '[data-testid="stVegaLiteChart"]'


# --- the pages app.py lists --------------------------------------------------------------------


@dataclass(frozen=True)
class PageInfo:
    path: str          # as written in app.py, relative to the repository root ("views/one_head.py")
    title: str
    url_path: str      # "" for the default page (served at "/")
    default: bool

    @property
    def name(self) -> str:
        """File stem, used for test ids and screenshot names ("one_head")."""
        return Path(self.path).stem

    @property
    def file(self) -> Path:
        return ROOT / self.path

    @property
    def exists(self) -> bool:
        return self.file.is_file()


def _inferred_url_path(path: str) -> str:
    """The URL path Streamlit infers from a page file's name (its own helper when importable)."""
    try:
        from streamlit.source_util import page_icon_and_name
        return page_icon_and_name(Path(path))[1]
    except Exception:  # noqa: BLE001 - fall back to the plain file stem
        return Path(path).stem


def discover_pages(app: Path = APP) -> list[PageInfo]:
    """Every ``st.Page("<file>.py", ...)`` call in ``app.py``, in order of appearance."""
    tree = ast.parse(app.read_text(encoding="utf-8"))
    pages = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "Page"):
            continue
        if not (node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            continue
        path = node.args[0].value
        kw = {k.arg: k.value.value for k in node.keywords if isinstance(k.value, ast.Constant)}
        default = bool(kw.get("default", False))
        url_path = "" if default else (kw.get("url_path") or _inferred_url_path(path)).strip("/")
        title = kw.get("title") or _inferred_url_path(path).replace("_", " ")
        pages.append(((node.lineno, node.col_offset),
                      PageInfo(path=path, title=title, url_path=url_path, default=default)))
    return [page for _, page in sorted(pages, key=lambda item: item[0])]


def missing_page_files(pages: list[PageInfo] | None = None) -> list[str]:
    return [p.path for p in (pages if pages is not None else discover_pages()) if not p.exists]


def skip_or_fail(reason: str) -> None:
    """Skip locally; fail in CI (``REQUIRE_BROWSER=1``), where nothing may be skipped."""
    if STRICT:
        pytest.fail(f"{reason} (REQUIRE_BROWSER=1: required in CI)", pytrace=False)
    pytest.skip(reason)


def router_script(workdir: Path) -> Path:
    """``app.py`` itself when every page it lists exists; otherwise a copy without the missing pages.

    Pages are written by several people at once: a router naming a file that is not there yet
    fails as a whole, so while that is so the tests run a copy (with absolute page paths) that
    lists only the pages present. In CI every page must exist (``test_pages`` checks it).
    """
    pages = discover_pages()
    missing = {p.path for p in pages if not p.exists}
    if not missing:
        return APP
    tree = ast.parse(APP.read_text(encoding="utf-8"))

    class _Filter(ast.NodeTransformer):
        def visit_List(self, node):
            self.generic_visit(node)
            node.elts = [e for e in node.elts if not _page_call_for(e, missing)]
            return node

        def visit_Dict(self, node):
            self.generic_visit(node)
            keep = [(k, v) for k, v in zip(node.keys, node.values)
                    if not (isinstance(v, ast.List) and not v.elts)]
            node.keys, node.values = [k for k, _ in keep], [v for _, v in keep]
            return node

        def visit_Constant(self, node):
            if isinstance(node.value, str) and node.value.endswith(".py") and (ROOT / node.value).is_file():
                return ast.copy_location(ast.Constant(str(ROOT / node.value)), node)
            return node

    tree = ast.fix_missing_locations(_Filter().visit(tree))
    script = workdir / "app.py"
    script.write_text(ast.unparse(tree), encoding="utf-8")
    return script


def _page_call_for(node, paths) -> bool:
    return (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in paths)


# --- the server ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc/<pid>/task/*/children)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*") if Path(f"/proc/{p}/task").exists() else []:
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return found


class StreamlitServer:
    """``streamlit run <script>`` on 127.0.0.1:<free port>, for the life of a ``with`` block."""

    def __init__(self, *, numba_cache_dir: str | None = None, extra_env: dict | None = None,
                 start_timeout: float = 90.0, watch_files: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._workdir = Path(tempfile.mkdtemp(prefix="attn-server-"))
        self.log_path = self._workdir / "server.log"
        self.numba_cache_dir = numba_cache_dir
        self.extra_env = extra_env or {}
        self.start_timeout = start_timeout
        self.watch_files = watch_files   # True: Streamlit's own file watcher, as a student's server has it
        self.proc: subprocess.Popen | None = None
        self.peak_rss_kb = 0

    def __enter__(self) -> "StreamlitServer":
        script = router_script(self._workdir)
        env = dict(os.environ)
        # A hosted server has no CUDA simulator; the tests' conftest sets it for the kernels' tests.
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] = "false"
        # As a deployed server runs: the warm-up compiles in its niced child while pages run the
        # readable twins (the test process itself sets ATTN_WARMUP=0). A server compiling in its own
        # threads would hold the interpreter's lock for minutes on a busy machine.
        env["ATTN_WARMUP"] = "1"
        if self.numba_cache_dir:
            env["NUMBA_CACHE_DIR"] = self.numba_cache_dir
        env.update(self.extra_env)
        cmd = [sys.executable, "-m", "streamlit", "run", str(script),
               "--server.headless", "true", "--server.address", "127.0.0.1",
               "--server.port", str(self.port),
               "--server.fileWatcherType", "auto" if self.watch_files else "none",
               "--server.runOnSave", "false", "--browser.gatherUsageStats", "false"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.25)
        self.__exit__(None, None, None)
        raise RuntimeError(f"streamlit did not answer /_stcore/health within {self.start_timeout:.0f} s:\n{self.log()}")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.sample_rss()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        if getattr(self, "_log", None):
            self._log.close()
        shutil.rmtree(self._workdir, ignore_errors=True)   # the router copy and the server log

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def sample_rss(self) -> int:
        """Peak resident memory (VmHWM, kB) of the server and its children, updated on each call.

        Sums each process's own high-water mark: an upper bound on the tree's true joint peak.
        """
        if not self.alive():
            return self.peak_rss_kb
        pids = _descendants(self.proc.pid)
        hwm = sum(_proc_status_kb(p, "VmHWM") for p in pids)
        rss = sum(_proc_status_kb(p, "VmRSS") for p in pids)
        self.peak_rss_kb = max(self.peak_rss_kb, hwm, rss)
        return self.peak_rss_kb

    def page_url(self, page: PageInfo, query: str = "") -> str:
        return f"{self.url}/{page.url_path}" + (f"?{query}" if query else "")


# --- the browser ----------------------------------------------------------------------------------


def chromium_or_skip() -> str:
    """Path of Debian's Chromium, after checking that the ``playwright`` package imports."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as err:
        skip_or_fail(f"the Python package 'playwright' is not installed ({err}); pip install playwright")
    for path in CHROMIUM_PATHS:
        if Path(path).exists():
            return path
    found = shutil.which("chromium")
    if found:
        return found
    skip_or_fail("Chromium is not installed (apt-get install -y chromium); Playwright's own browser "
                 "download is not used here")
    return ""


BROWSER_NICE = 10      # the browsers stand for students' machines: the server under test comes first


def _niced(executable: str) -> str:
    """A launcher that starts ``executable`` at ``BROWSER_NICE``: on a two-core machine the browsers
    would otherwise take the server's cores, and a test would measure them, not the server."""
    launcher = Path(tempfile.gettempdir()) / f"attn-niced-browser-{os.getuid()}-{BROWSER_NICE}"
    text = f'#!/bin/sh\nexec nice -n {BROWSER_NICE} "{executable}" "$@"\n'
    if not launcher.exists() or launcher.read_text() != text:
        partial = launcher.with_suffix(f".{os.getpid()}")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.replace(launcher)
    return str(launcher)


def launch_options(executable: str) -> dict:
    nice = shutil.which("nice")
    return {"executable_path": _niced(executable) if nice else executable, "headless": True, "args": CHROMIUM_ARGS}


def follow_run(page, status_of, start, *, guard_s: float = 900) -> list:
    """``start()`` a background run, then follow what the page says until it ends: every distinct
    status seen, as ``status_of(page)`` returns it (None while it shows none).

    A run in progress says so: "queued" (its place), "compiling" (what it waits on), "running". The
    wait ends on the page's word alone; ``guard_s`` only stops a hang, and then the failure quotes
    what the page said last, so a slow machine and a stuck run read differently in the log.
    """
    before = status_of(page)
    start()
    seen, said, deadline = [], "", time.monotonic() + guard_s
    while not (seen and seen[-1][0] not in ("queued", "compiling", "running", "idle")):
        status = status_of(page)
        if status and status != before and (not seen or seen[-1] != status):
            seen.append(status)
        bars = page.query_selector_all('[data-testid="stProgress"]')
        said = bars[0].inner_text() if bars else said
        if time.monotonic() > deadline:
            raise AssertionError(f"the run had not ended after {guard_s:.0f} s; the page said last: {said!r}; "
                                 f"statuses seen: {seen}")
        page.wait_for_timeout(200)
    return seen


IDLE_JS = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    if (!app || app.getAttribute('data-test-connection-state') !== 'CONNECTED') return false;
    if (app.getAttribute('data-test-script-state') !== 'notRunning') return false;
    if (!document.querySelector('[data-testid="stMainBlockContainer"] [data-testid="stElementContainer"]')) return false;
    // lazily loaded widgets and charts show a skeleton until their code has arrived
    if (document.querySelector('[data-testid="stMain"] [data-testid="stSkeleton"]')) return false;
    const status = document.querySelector('[data-testid="stStatusWidget"]');
    return !(status && /Running/.test(status.innerText));
}"""


def wait_idle(page, timeout_ms: float = 90_000, settle_ms: int = 400) -> None:
    """Wait until the session is connected, its script run has ended and the page holds content.

    Checked twice, ``settle_ms`` apart: between the connection and the first run, and between a
    widget change and the rerun it triggers, the state reads "notRunning" for a moment. Widgets
    and charts whose code is loaded on demand show a skeleton first: none may be left.
    """
    page.wait_for_function(IDLE_JS, timeout=timeout_ms, polling=100)
    page.wait_for_timeout(settle_ms)
    page.wait_for_function(IDLE_JS, timeout=timeout_ms, polling=100)


def failure_screenshot(page, name: str) -> None:
    """What the page showed when a check failed (``FAILED_{name}.png``), for the CI log's reader."""
    try:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"FAILED_{name}.png"), full_page=True)
    except Exception:  # noqa: BLE001 - the failure itself is what matters
        pass


def error_texts(page) -> list[str]:
    """Text of every traceback box and every ``st.error`` box on the page."""
    texts = []
    for selector in ERROR_SELECTORS:
        for el in page.query_selector_all(selector):
            texts.append(f"{selector}: {el.inner_text()[:500]}")
    return texts


def charts_drawn(page) -> tuple[int, int]:
    """(number of Altair charts, number of them with a drawn canvas or svg)."""
    charts = page.query_selector_all(CHART)
    drawn = sum(1 for c in charts if c.query_selector("canvas, svg"))
    return len(charts), drawn


def operate_first_slider(page, back: bool = False) -> bool:
    """Move the first slider in the main area one step right (``back``: left), if there is one."""
    thumbs = page.query_selector_all(f'{MAIN} [data-testid="stSlider"] input[type="range"], '
                                     f'{MAIN} [data-testid="stSlider"] [role="slider"]')
    if not thumbs:
        return False
    thumb = thumbs[0]
    thumb.focus()
    forward, reverse = ("ArrowLeft", "ArrowRight") if back else ("ArrowRight", "ArrowLeft")
    before = thumb.get_attribute("aria-valuetext") or thumb.get_attribute("aria-valuenow")
    page.keyboard.press(forward)
    page.wait_for_timeout(150)
    after = thumb.get_attribute("aria-valuetext") or thumb.get_attribute("aria-valuenow")
    if after == before:  # already at the end: go the other way
        page.keyboard.press(reverse)
    return True


def operate_first_selectbox(page, back: bool = False) -> bool:
    """Choose the second option of the first selectbox in the main area (``back``: the first)."""
    boxes = page.query_selector_all(f'{MAIN} [data-testid="stSelectbox"]')
    if not boxes:
        return False
    box = boxes[0]
    box.scroll_into_view_if_needed()
    box.click()
    options = page.locator('[role="listbox"] [role="option"]')
    try:
        options.first.wait_for(timeout=5_000)
    except Exception:  # noqa: BLE001 - a disabled box opens nothing
        page.keyboard.press("Escape")
        return False
    count = options.count()
    options.nth(0 if back or count < 2 else 1).click()
    return True


def operate_first_number_input(page, back: bool = False) -> bool:
    """Press "+" (``back``: "-") on the first number input in the main area, if there is one."""
    ids = ("stNumberInputStepDown", "stNumberInputStepUp") if back else ("stNumberInputStepUp", "stNumberInputStepDown")
    first = page.query_selector(f'{MAIN} [data-testid="stNumberInput"]')
    if first is None:
        return False
    for test_id in ids:
        button = first.query_selector(f'[data-testid="{test_id}"]')
        if button is not None and button.is_enabled():
            button.click()
            return True
    return False


# --- colours --------------------------------------------------------------------------------------


def relative_luminance(rgb) -> float:
    """WCAG 2 relative luminance of an sRGB colour given as 0..255 channels."""
    def linear(c):
        c = c / 255.0
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(c) for c in rgb[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(a, b) -> float:
    """WCAG 2 contrast ratio (L_light + 0.05) / (L_dark + 0.05), from 1 (same) to 21 (black on white)."""
    la, lb = sorted((relative_luminance(a), relative_luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def over(rgba, background) -> tuple[float, float, float]:
    """A colour with alpha ``rgba[3]`` painted over an opaque ``background``, as the browser shows it."""
    alpha = rgba[3] if len(rgba) > 3 else 1.0
    return tuple(alpha * f + (1 - alpha) * b for f, b in zip(rgba[:3], background[:3]))


_RGBA_JS = """
    const ctx = Object.assign(document.createElement('canvas'), {width: 1, height: 1})
        .getContext('2d', {willReadFrequently: true});
    // any CSS colour (name, #hex, rgb()) -> [r, g, b, alpha], by painting one pixel with it
    const rgba = (c) => {
        if (!c || c === 'none' || c === 'transparent') return null;
        ctx.clearRect(0, 0, 1, 1); ctx.fillStyle = '#000'; ctx.fillStyle = c; ctx.fillRect(0, 0, 1, 1);
        const d = ctx.getImageData(0, 0, 1, 1).data;
        return [d[0], d[1], d[2], d[3] / 255];
    };
    // an SVG element's fill or stroke with its opacities folded into alpha
    const paint = (el, which) => {
        const c = rgba(el.getAttribute(which));
        if (!c) return null;
        for (const name of ['opacity', which + '-opacity']) c[3] *= parseFloat(el.getAttribute(name) ?? '1');
        return c;
    };
"""


def app_background(page) -> tuple[int, int, int]:
    """The computed background colour of the app (``stApp``), as 0..255 channels."""
    return tuple(page.evaluate("() => {" + _RGBA_JS + """
        return rgba(getComputedStyle(document.querySelector('[data-testid="stApp"]')).backgroundColor); }"""))[:3]


def chart_colours(page) -> list[dict]:
    """The colours each Altair/Vega-Lite chart on the page draws (SVG renderer), one dict per chart.

    - ``series``: ``[kind, rgba]`` of every bar, point, line and rule (marks drawn on the page's
      background; heatmap cells are not among them: their colour is the data);
    - ``notes``: ``[text, text rgba, cell rgba]`` of every number written inside a heatmap cell;
    - ``texts``: ``[text, rgba]`` of the axis labels and titles, legend labels and titles, chart titles.
    """
    return page.evaluate("(sel) => {" + _RGBA_JS + """
        return Array.from(document.querySelectorAll(sel)).map((chart) => {
            const svg = chart.querySelector('svg');
            if (!svg) return {series: [], notes: [], texts: []};
            const items = (role) => Array.from(svg.querySelectorAll(`g.role-mark > [aria-roledescription="${role}"]`));
            const series = [];
            for (const el of [...items('bar'), ...items('point')]) series.push([el.getAttribute('aria-roledescription'), paint(el, 'fill') || paint(el, 'stroke')]);
            for (const el of [...items('line mark'), ...items('rule mark')]) series.push([el.getAttribute('aria-roledescription'), paint(el, 'stroke')]);
            // a number in a cell: the text's centre lies inside the cell it labels
            const cells = items('rect mark').map((el) => [el.getBoundingClientRect(), el]);
            const notes = [];
            for (const t of items('text mark')) {
                const b = t.getBoundingClientRect(), x = b.left + b.width / 2, y = b.top + b.height / 2;
                const under = cells.filter(([r]) => r.left <= x && x <= r.right && r.top <= y && y <= r.bottom);
                if (under.length) notes.push([t.textContent, paint(t, 'fill'), paint(under[under.length - 1][1], 'fill')]);
            }
            const texts = Array.from(svg.querySelectorAll(
                'g.role-axis-label > text, g.role-axis-title > text, g.role-legend-label > text, ' +
                'g.role-legend-title > text, g.role-title-text > text'))
                .map((t) => [t.textContent, paint(t, 'fill')])
                .filter(([text, c]) => text.trim() && c && c[3] > 0);   // Vega hides overlapping labels: opacity 0
            return {series, notes, texts};
        });
    }""", CHART)


# --- the pages' questions ---------------------------------------------------------------------------

def css_key(key: str) -> str:
    """The class Streamlit gives a keyed widget's container (a dot in the key becomes a dash)."""
    return ".st-key-" + key.replace(".", "-")


def answer_question(page, q, value, timeout_ms: float = 90_000) -> None:
    """Give ``value`` (an option's text or a number) to question ``q`` as a student would, press its
    Check button, and wait for the rerun."""
    box = page.locator(css_key(f"predict_{q.key}"))
    if q.options:
        box.locator("label").filter(has_text=value[:40]).first.click()
    else:
        box.locator("input").fill(str(value))
        box.locator("input").press("Enter")
    wait_idle(page, timeout_ms=timeout_ms)
    page.locator(css_key(f"predict_{q.key}_check")).locator("button").click()
    wait_idle(page, timeout_ms=timeout_ms)


def answer_opening(page, address: str, timeout_ms: float = 90_000) -> bool:
    """Answer the opening question of lesson page ``address`` right, as a student who has, so its
    locked control opens. False for a page that is not on the path (no question)."""
    from core.lessons import path, questions
    if address not in path.BY_PAGE:
        return False
    q = questions.opening(address)
    answer_question(page, q, q.options[q.answer] if q.options else q.answer_text, timeout_ms)
    return True
