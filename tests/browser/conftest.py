"""One ``streamlit run app.py`` for every browser test of the session (each test opens its own
browser session on it, so no state crosses between tests; server-wide caches are shared, as a
class's are). The load test and the tests that need a fresh or a file-watching server start their own."""
import pytest

from browser_support import StreamlitServer, chromium_or_skip


@pytest.fixture(scope="session")
def server():
    chromium_or_skip()
    with StreamlitServer() as srv:
        yield srv
