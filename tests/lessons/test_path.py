"""The path through the lessons: every lesson page on it once, prerequisites first, in the sidebar's order."""
import re
from pathlib import Path

import pytest

from core.lessons import path

ROOT = Path(__file__).resolve().parents[2]
BESIDE_THE_PATH = {"home", "check_yourself", "make_it_fast"}   # the Overview, the gathering page, the kernels


def sidebar_pages() -> list[str]:
    return re.findall(r'st\.Page\("views/(\w+)\.py"', (ROOT / "app.py").read_text())


def test_every_lesson_page_of_the_sidebar_is_on_the_path_in_the_same_order():
    lessons = [p for p in sidebar_pages() if p not in BESIDE_THE_PATH]
    assert lessons == [s.page for s in path.STEPS]


def test_each_page_comes_after_the_pages_it_needs():
    seen = set()
    for s in path.STEPS:
        assert set(s.needs) <= seen, f"{s.page} needs {set(s.needs) - seen}, which come later"
        seen.add(s.page)


def test_every_step_names_a_section_of_one_of_the_lessons_and_a_claim():
    lessons = {path.TRANSFORMER, path.MULTI_HEAD, path.LESSON_09}
    for s in path.STEPS:
        assert s.lesson in lessons and s.section and s.claim.endswith(".")


def test_each_lesson_page_shows_its_place_on_the_path():
    """Every page on the path calls the header and the opening question with its own address."""
    for s in path.STEPS:
        source = (ROOT / "views" / f"{s.page}.py").read_text()
        assert f'lesson.header("{s.page}")' in source and f'lesson.predict("{s.page}")' in source, s.page


def test_an_unknown_page_is_refused_by_name():
    with pytest.raises(ValueError, match="No lesson page 'nowhere'"):
        path.step("nowhere")
