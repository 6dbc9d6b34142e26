"""Screenshots of ``aiayn explore`` for the README, taken in headless Chromium.

    python tools/explorer_screenshots.py --checkpoint de-en=runs/multi30k_de_en/averaged \\
        --checkpoint shakespeare=runs/shakespeare_char/checkpoint --out docs/figures

Starts the explorer on a free port, opens it with Playwright (Debian's chromium), and writes
explorer_translation.png (cross-attention of a translation), explorer_lm.png (a language
model's masked self-attention, one query's row and its next-token distribution) and
explorer_lesson.png (one query, step by step).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from aiayn.explore.chromium import CHROMIUM_ARGS, find_chromium
from aiayn.explore.registry import default_registry
from aiayn.explore.server import create_app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR")
    p.add_argument("--out", default="docs/figures")
    args = p.parse_args()
    registry = default_registry(args.checkpoint)
    names = list(registry.entries)
    arch = {n: registry.entries[n].config.arch for n in names}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_app(registry), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chromium = find_chromium()
    if chromium is None:
        raise SystemExit("no chromium installed: run make setup-browser")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1150, "height": 900})
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("body[data-ready='1']")
        settle = "window.explorer.pending === 0"
        for name in names:
            page.select_option("#model", name)
            if arch[name] == "encoder-decoder":
                page.fill("#text", "Zwei Hunde spielen im Schnee .")
                page.click("#translate")
                page.wait_for_function("document.getElementById('target').value !== ''")
                page.wait_for_timeout(800)
                page.wait_for_function(settle)
                page.locator("#model-section").screenshot(path=out / "explorer_translation.png")
            elif arch[name] == "decoder":
                page.fill("#text", "ROMEO: But soft, what light through yonder window")
                page.select_option("#layer", "1")
                page.wait_for_timeout(800)
                page.wait_for_function(settle)
                box = page.locator("#heatmap .nsewdrag").first.bounding_box()
                assert box is not None
                page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.97)
                page.wait_for_timeout(400)
                page.locator("#model-section").screenshot(path=out / "explorer_lm.png")
        page.locator("#lessons article").first.screenshot(path=out / "explorer_lesson.png")
        browser.close()
    server.should_exit = True
    print(f"wrote {', '.join(str(f) for f in sorted(out.glob('explorer_*.png')))}")


if __name__ == "__main__":
    main()
