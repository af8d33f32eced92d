"""Opening a page through Streamlit's AppTest, as a visitor would from a link."""
from streamlit.testing.v1 import AppTest


def open_page(page: str, link: dict | None = None) -> AppTest:
    """Run ``page`` once, opened from a link whose query parameters are ``link`` (none by default)."""
    at = AppTest.from_file(page, default_timeout=60)
    for name, value in (link or {}).items():
        at.query_params[name] = value
    return at.run()
