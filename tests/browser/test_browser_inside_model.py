"""The "Inside a trained model" page in a real browser (Chromium driven by Playwright): a link opens
it with its settings, every chart is drawn, the example's prediction is the model's, and stepping
the example moves the URL and the numbers. Skipped without Chromium (failed under REQUIRE_BROWSER=1)."""
from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from browser_support import (MAIN, SCREENSHOTS, charts_drawn, chromium_or_skip, discover_pages,
                             error_texts, launch_options, wait_idle)
from core.lessons import inside
from core.model.tuned import classifier

COLD_MS = 240_000      # first visit: compiles the kernels, trains the default model, scores every head
WARM_MS = 60_000


def _metric(page, label: str) -> str:
    box = page.locator(f'{MAIN} [data-testid="stMetric"]', has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


@pytest.fixture(scope="module")
def default_model():
    return inside.default_model("sum", 0)     # the page's default model, as the page reads it


def test_inside_model_page_in_browser(default_model, server):
    chromium = chromium_or_skip()
    info = next(p for p in discover_pages() if p.path.endswith("inside_model.py"))
    from playwright.sync_api import sync_playwright

    X, y = default_model.data.X_test, default_model.data.y_test
    logits, _ = classifier.forward(default_model.params, X[3:5], default_model.cfg)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(**launch_options(chromium))
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        try:
            page.goto(server.page_url(info, "example=3&layer=2"), timeout=COLD_MS)
            wait_idle(page, COLD_MS)
            assert page.locator(f"{MAIN} h1").first.inner_text().startswith("Inside a trained model")
            assert error_texts(page) == []
            body = page.locator(MAIN).inner_text()
            assert "(T, d_model) = (16, 32)" in body and "(T, d_ff) = (16, 64)" in body
            assert "layer 2 input x" in body
            total, drawn = charts_drawn(page)
            assert total >= 10 and drawn == total, (total, drawn)
            assert _metric(page, "True label") == str(y[3])
            assert _metric(page, "Predicted class") == str(int(np.argmax(logits[0])))
            # one step of the example input: the URL and the numbers follow
            box = page.locator(f'{MAIN} [data-testid="stNumberInput"]', has_text="Test example").first
            box.locator('[data-testid="stNumberInputStepUp"]').click()
            wait_idle(page, WARM_MS)
            assert parse_qs(urlparse(page.url).query).get("example") == ["4"], page.url
            assert _metric(page, "True label") == str(y[4])
            assert _metric(page, "Predicted class") == str(int(np.argmax(logits[1])))
            assert error_texts(page) == []
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "inside_model_walkthrough.png"), full_page=True)
        except BaseException:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "inside_model_failure.png"), full_page=True)
            print(server.log())
            raise
        finally:
            browser.close()
