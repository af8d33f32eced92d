"""The Overview page: every page of the router is introduced, and the "why attention" numbers
follow the sequence length."""
import re
from pathlib import Path

from core.lessons import path
from page_support import open_page, table_named
from source_support import opened_source

ROOT = Path(__file__).resolve().parents[2]
PAGE = str(ROOT / "views" / "home.py")


def text(at) -> str:
    return " ".join(m.value for m in at.markdown) + " " + " ".join(c.value for c in at.caption)


def test_the_overview_introduces_every_page_of_the_router():
    at = open_page(PAGE)
    assert not at.exception
    titles = re.findall(r'st\.Page\([^)]*title="([^"]+)"', (ROOT / "app.py").read_text())
    assert len(titles) == 14
    shown = text(at) + " ".join(link.proto.label for link in at.get("page_link"))
    missing = [t for t in titles if t != "Overview" and t not in shown]
    assert missing == []


def test_the_overview_draws_the_path_each_page_a_link_with_its_section_and_claim():
    """The graph has one node per step, numbered in the path's order, and an arrow from each
    prerequisite not already implied by another; each step is a link to its page (the same tab),
    beside its section and claim."""
    at = open_page(PAGE)
    (graph,) = at.get("graphviz_chart")
    spec = graph.proto.spec
    labels = re.findall(r'"(\w+)" \[label="(\d+)\. ([^"]+)"\]', spec)
    assert [(page, int(n), title) for page, n, title in labels] == \
        [(s.page, i, s.title) for i, s in enumerate(path.STEPS, start=1)]
    arrows = set(re.findall(r'"(\w+)" -> "(\w+)"', spec))
    assert arrows == {(need, s.page) for s in path.STEPS for need in s.needs if not path.implied(s.page, need)}
    assert ("multi_head", "training") not in arrows and ("parameters", "training") in arrows
    links = [(link.proto.label, link.proto.page) for link in at.get("page_link")]
    assert links == [(f"{i}. {s.title}", s.page) for i, s in enumerate(path.STEPS, start=1)]
    body = text(at)
    for s in path.STEPS:
        assert f"{s.lesson}: *{s.section}*. **Verify:** {s.claim}" in body


def test_a_prerequisite_is_implied_when_another_prerequisite_leads_to_it():
    assert path.implied("training", "multi_head")          # parameters already needs multi_head
    assert not path.implied("training", "parameters")
    assert not path.implied("real_model", "induction") and not path.implied("real_model", "inside_model")


def test_sequential_steps_and_path_length_follow_the_number_of_tokens():
    at = open_page(PAGE)
    table = table_named(at, "per layer")
    assert table.loc["steps that must run one after another", "recurrent network"] == 512
    assert table.loc["most steps between two tokens", "recurrent network"] == 511
    assert (table["self-attention"] == 1).all()
    assert "512² = 262,144 scores" in text(at)
    at.slider(key="home.n").set_value(10).run()
    table = table_named(at, "per layer")
    assert table.loc["most steps between two tokens", "recurrent network"] == 9
    assert (table["self-attention"] == 1).all()
    assert "10² = 100 scores" in text(at)
    # the expander shows the function that computed the table (marked as one the page's record notes)
    (code,) = opened_source(at, "The code behind this table").code
    assert code.value.startswith("@recorded\ndef interaction_paths(n_tokens: int) -> PathLengths:")


def test_the_course_modules_cautions_are_on_the_page():
    body = text(open_page(PAGE))
    for caution in ("Bias amplification", "Memorisation", "Environmental cost", "Misused cross-attention",
                    "diagnostics, not explanations", "Position is not reasoning"):
        assert caution in body


def test_what_the_overview_says_about_links_is_true():
    """The Overview says which pages keep their settings in the address; a page keeps them when it
    writes them there (``state.publish``). The README says the same (every lesson page but one)."""
    at = open_page(PAGE)
    assert "Every lesson page except Check yourself keeps its settings in the address" in " ".join(text(at).split())
    publishing = {p.stem for p in (ROOT / "views").glob("*.py") if "publish(" in p.read_text()}
    lessons = {p.stem for p in (ROOT / "views").glob("*.py")} - {"home"}
    assert lessons - publishing == {"check_yourself"}
