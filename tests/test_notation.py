"""The notation card's conventions, held over every text a student reads: the pages, their parts and
the README. One name for the output projection (W_O), h only ever a head's index, z only the logits,
head names counted from 1 with the papers' 0-based names kept out of the running text."""
import re
from pathlib import Path

import pytest

from core.lessons import notation
from core.model import names

ROOT = Path(__file__).resolve().parents[1]
TEXTS = sorted([*ROOT.glob("views/*.py"), *ROOT.glob("ui/*.py"), *ROOT.glob("core/lessons/**/*.py"), ROOT / "README.md"])

FORBIDDEN = {
    r"W\^\{?O\}?|W\^O": "the output projection is W_O (W_O^{(h)} for head h's block), never W^O",
    r"\bz_h\b|\bz_\{h\}": "a head's output is o_h; z is the logits",
    r"\\bar h\b|h\^\{\(L\)\}|\bh_t\b": "the residual stream is x_t^{(ℓ)}; h is a head's index",
    r"\bL\d+H\d+ \(\d+\.\d+\)": "a head is named L3H2; the papers' 2.1 goes in a tooltip, not beside it",
    r"\blayer 0\b|\bhead 0\b": "layers and heads are counted from 1 where a student reads them",
}


@pytest.mark.parametrize("pattern", FORBIDDEN, ids=list(FORBIDDEN.values()))
def test_no_text_breaks_the_notation(pattern):
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:120]}"
             for p in TEXTS for n, line in enumerate(p.read_text().splitlines(), start=1) if re.search(pattern, line)]
    assert found == [], FORBIDDEN[pattern]


def test_head_names_count_from_one_and_the_papers_from_zero():
    assert names.head(2, 1) == "L3H2" and names.paper_head(2, 1) == "2.1"
    assert names.head(0, 9) == "L1H10" and names.paper_head(6, 9) == "6.9"


def test_the_card_defines_the_symbols_the_pages_use():
    symbols = " ".join(s for s, _ in notation.SYMBOLS)
    for needed in ("d_{\\text{model}}", "d_k", "d_v", "H", "A_h", "W_O^{(h)}", "o_h", "z", "x_t^{(\\ell)}"):
        assert needed in symbols
    meanings = " ".join(m for _, m in notation.SYMBOLS)
    assert "QK circuit" in meanings and "OV circuit" in meanings and "counted from 1" in meanings
