"""The Positional encoding page: order blindness measured, the offset property, small-d collisions."""
from pathlib import Path

import numpy as np

from core import positional

from page_support import open_page

PAGE = str(Path(__file__).resolve().parents[1] / "pages" / "positional.py")


def test_page_shows_order_blindness_and_the_sinusoidal_code():
    at = open_page(PAGE)
    assert not at.exception
    headings = [h.value for h in at.header]
    assert headings == ["Attention alone is blind to order", "The sinusoidal code", "Other codes, seen in the scores"]
    plain = positional.order_blindness("dog bites man".split(), "man bites dog".split(), with_pe=False, backend="cpu")
    coded = positional.order_blindness("dog bites man".split(), "man bites dog".split(), with_pe=True, backend="cpu")
    assert plain.is_permutation and not coded.is_permutation
    gaps = [m.value for m in at.metric]
    assert gaps == [f"{plain.gap:.2e}", f"{coded.gap:.2e}"]
    assert float(gaps[0]) < 1e-12 < 0.1 < float(gaps[1])
    text = " ".join(m.value for m in at.markdown)
    assert "outputs are **a permutation** of each other; with positions they are **different**" in text
    assert "Kernel source" in " ".join(e.label for e in at.expander)


def test_offset_property_and_collisions_on_screen():
    at = open_page(PAGE)
    PE = positional.sinusoidal(50, 128, backend="cpu")
    dots = positional.offset_dot_products(PE, 5)
    assert np.ptp(dots) < 1e-10
    text = " ".join(m.value for m in at.markdown)
    assert f"every p gives {dots.mean():.6f}" in text
    table = at.dataframe[0].value
    pairs = positional.collisions_by_width(100, [2, 4, 8, 16, 32, 64], backend="cpu")
    assert table["apart"].tolist() == [p.j - p.i for p in pairs]
    # d_model = 2: positions 2 and 46 (44 ~ 7·2π apart) are 0.018 apart on a unit circle
    assert table["closest pair"][0] == "2 and 46" and table["distance"][0] < 0.02 < table["typical |PE|"][0]
    assert table["apart"].iloc[-1] == 1                                # d_model = 64: neighbours only


def test_widgets_rerun_and_bad_input_is_a_message():
    at = open_page(PAGE)
    at.text_input(key="positional.b").set_value("man bites cat").run()
    assert not at.exception and "same words" in at.error[0].value
    at.text_input(key="positional.a").set_value("the cat saw the dog")
    at.text_input(key="positional.b").set_value("the dog saw the cat").run()
    assert not at.exception and not at.error
    at.text_input(key="positional.a").set_value(" ".join(["w"] * 17)).run()
    assert "at most 16" in at.error[0].value
    at.slider(key="positional.d").set_value(4)
    at.slider(key="positional.k").set_value(3)
    at.slider(key="positional.from").set_value(10).run()
    assert not at.exception
    dots = positional.offset_dot_products(positional.sinusoidal(50, 4, backend="cpu"), 3)
    assert f"every p gives {dots.mean():.6f}" in " ".join(m.value for m in at.markdown)


def test_a_link_restores_the_controls_and_out_of_range_positions_are_clamped():
    at = open_page(PAGE, {"a": "a b c", "b": "c b a", "T": "12", "d": "7", "base": "500", "from": "40",
                          "k": "30", "Tc": "20", "Ts": "5"})
    assert not at.exception and not at.error and not at.warning
    assert at.text_input(key="positional.a").value == "a b c"
    assert at.slider(key="positional.T").value == 12 and at.slider(key="positional.d").value == 6   # even
    assert at.number_input(key="positional.base").value == 500.0
    assert at.slider(key="positional.from").value == 11 and at.slider(key="positional.k").value == 11
    dots = positional.offset_dot_products(positional.sinusoidal(12, 6, 500.0, backend="cpu"), 11)
    assert f"every p gives {dots.mean():.6f}" in " ".join(m.value for m in at.markdown)
    at.slider(key="positional.T").set_value(20).run()
    assert at.query_params["T"] == "20" and at.query_params["base"] == "500"
