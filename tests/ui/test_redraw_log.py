"""The server's own time per page run (ui/redraw_log.py), as the load test reads it."""
import importlib

import pytest

from ui import redraw_log


@pytest.fixture
def log_at(tmp_path, monkeypatch):
    path = tmp_path / "redraws.tsv"
    monkeypatch.setenv("ATTN_REDRAW_LOG", str(path))
    yield importlib.reload(redraw_log), path
    monkeypatch.delenv("ATTN_REDRAW_LOG")
    importlib.reload(redraw_log)


def test_each_page_run_is_one_line_read_back_by_page(log_at):
    log, path = log_at
    for page in ("one_head", "masks", "one_head"):
        with log.timed(page):
            pass
    runs = log.read(str(path))
    assert sorted(runs) == ["masks", "one_head"] and len(runs["one_head"]) == 2
    assert all(0 <= s < 60 for times in runs.values() for s in times)


def test_a_run_cut_short_is_not_a_redraw(log_at):
    log, path = log_at
    with pytest.raises(RuntimeError), log.timed("one_head"):
        raise RuntimeError("st.rerun")
    assert not path.exists()


def test_without_the_variable_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTN_REDRAW_LOG", raising=False)
    log = importlib.reload(redraw_log)
    monkeypatch.chdir(tmp_path)
    with log.timed("one_head"):
        pass
    assert list(tmp_path.iterdir()) == []
