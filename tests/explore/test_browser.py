"""End to end in headless Chromium (Debian's package, driven by Playwright): the page loads,
typing a sentence draws a heatmap with one row per token, the temperature slider changes the
weights shown, the causal toggle blanks the upper triangle, and the lessons render.

Skipped when no Chromium is installed, unless AIAYN_REQUIRE_BROWSER=1 (as in CI), which makes a
missing browser a failure."""

from __future__ import annotations

import os

import pytest

from aiayn.explore.chromium import CHROMIUM_ARGS, find_chromium

CHROMIUM = find_chromium()
REQUIRED = os.environ.get("AIAYN_REQUIRE_BROWSER") == "1"
if CHROMIUM is None and not REQUIRED:
    pytest.skip("no chromium installed (apt-get install chromium)", allow_module_level=True)
if REQUIRED and CHROMIUM is None:
    raise RuntimeError("AIAYN_REQUIRE_BROWSER=1 but no chromium is installed")


@pytest.fixture(scope="module")
def page(server):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server + "/")
        page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        yield page
        browser.close()
        assert not errors, errors


def heatmap(page) -> dict:
    """What the heatmap on the page draws right now: its cell values and the row labels as
    rendered on screen."""
    return page.evaluate(
        """() => {
          const gd = document.getElementById('heatmap');
          const trace = gd.data[0];
          const rows = [...gd.querySelectorAll('.ytick text')].map((t) => t.textContent);
          return {z: trace.z, rows, cells: gd.querySelectorAll('.hm, image').length};
        }"""
    )


def settle(page) -> None:
    page.wait_for_timeout(400)  # let debounced requests leave
    page.wait_for_function("window.explorer.pending === 0", timeout=15_000)


@pytest.mark.slow
def test_typing_a_sentence_draws_one_row_per_token(page):
    page.select_option("#model", "tiny-lm")
    page.fill("#text", "the cat sat")
    settle(page)
    shown = heatmap(page)
    assert len(shown["z"]) == len("the cat sat") and shown["cells"] >= 1
    assert shown["rows"] == ["t", "h", "e", "·", "c", "a", "t", "·", "s", "a", "t"]
    page.fill("#text", "a dog")
    settle(page)
    assert len(heatmap(page)["z"]) == 5


def test_the_slider_changes_the_weights(page):
    page.select_option("#model", "tiny-lm")
    page.fill("#text", "the cat sat")
    page.select_option("#head", "1")
    settle(page)
    before = heatmap(page)["z"]
    page.fill("#temperature", "0.2")
    settle(page)
    after = heatmap(page)["z"]
    assert page.inner_text("#temperature-value") == "0.20"
    assert len(after) == len(before) and after != before
    assert max(after[-1]) > max(before[-1])  # a lower temperature sharpens the last row


def test_the_causal_toggle_blanks_the_upper_triangle(page):
    page.select_option("#model", "tiny-lm")
    page.fill("#text", "abcdef")
    page.fill("#temperature", "1")
    settle(page)
    if page.is_checked("#causal"):
        page.uncheck("#causal")
        settle(page)
    z = heatmap(page)["z"]
    assert all(z[i][j] is not None and z[i][j] > 0 for i in range(6) for j in range(i + 1, 6))
    page.check("#causal")
    settle(page)
    z = heatmap(page)["z"]
    assert all(z[i][j] is None for i in range(6) for j in range(i + 1, 6))
    assert all(z[i][j] is not None for i in range(6) for j in range(i + 1))


def test_hover_shows_the_row_and_next_token_bars(page):
    page.select_option("#model", "tiny-lm")
    page.fill("#text", "hello")
    settle(page)
    box = page.locator("#heatmap .nsewdrag").first.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.1, box["y"] + box["height"] * 0.9)  # last query
    page.wait_for_timeout(300)
    title = page.evaluate("document.getElementById('row').layout.title.text")
    assert title.startswith('query 4 "o"')
    bars = page.evaluate("document.getElementById('next-token').data[0].x.length")
    assert bars == 15


def test_translation_model_shows_the_alignment(page):
    page.select_option("#model", "tiny-mt")
    assert page.is_visible("#translate") and page.is_disabled("#causal")
    page.fill("#text", "ein hund")
    page.fill("#target", "a dog")
    settle(page)
    shown = heatmap(page)
    assert shown["rows"][0] == "<s>" and len(shown["z"]) == len(shown["rows"])
    page.click("#translate")
    page.wait_for_function("document.getElementById('target').value !== 'a dog'")
    settle(page)


def test_errors_are_shown_not_swallowed(page):
    page.select_option("#model", "tiny-lm")
    page.fill("#text", "x" * 100)  # longer than the model's 64 positions
    settle(page)
    assert "at most 64" in page.inner_text("#error")
    page.fill("#text", "ok")
    settle(page)
    assert page.inner_text("#error") == ""


def test_lessons_render_library_numbers(page):
    assert "0.507" in page.inner_text("#lesson-steps")  # "it" puts about half on "cat"
    page.uncheck("#lesson-scale")
    page.wait_for_function("document.getElementById('lesson-steps').innerText.includes('0.887')")
    page.fill("#lookup-length", "8")
    page.wait_for_function("document.getElementById('lookup-output').innerText.includes('0.971')")
    page.fill("#kernel-sigma", "-1")  # the slider is log10(σ): σ = 0.1, a sharp kernel
    page.wait_for_function(
        "document.getElementById('kernel-sigma-value').innerText === '0.1'"
        " && document.getElementById('kernel-output').innerText.includes('σ = 0.1:')"
    )
    page.fill("#pe-position", "60")
    page.wait_for_function(
        "(() => { const y = document.getElementById('pe-chart').data[0].y;"
        " return y.indexOf(Math.max(...y)) === 60; })()"
    )
    page.select_option("#kv-preset", "llama3-70b")
    page.fill("#kv-context", "8192")
    page.wait_for_function("document.getElementById('kv-summary').innerText.includes('2.5 GiB')")


def test_an_image_model_draws_its_test_image(page):
    page.select_option("#model", "tiny-vit")
    page.wait_for_function("document.getElementById('image-info').innerText.includes('of 360')")
    assert page.is_hidden("#text-controls") and page.is_visible("#image-plots")
    page.fill("#image-index", "7")
    page.wait_for_function("document.getElementById('image-info').innerText.startsWith('image 7')")
    page.select_option("#model", "tiny-lm")
    assert page.is_visible("#text-controls") and page.is_hidden("#image-plots")
