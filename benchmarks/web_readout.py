"""Change -> readout time of the explorer page, in Chromium (Playwright, Debian's
/usr/bin/chromium, headless), against the page's own uvicorn server on loopback.

Each change is made in the page (a drop-down chosen, a number typed) and timed in the page
itself, from the change event to the redrawn readout (the page counts its draws in
body[data-renders]; a MutationObserver notes the time). Drop-downs ask at once; typing waits
TYPING_PAUSE_MS (80 ms) after the last key. Fresh plans (never asked before: the server
computes most of them; each cycle of values ends where it began, which is cached) and the same
changes again (every plan answered from its cache) are reported apart. Target: the
median within 150 ms.

    .venv/bin/python benchmarks/web_readout.py [--rounds 5] [--view desktop|phone]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

CHROMIUM = "/usr/bin/chromium"
VIEWS = {"desktop": {"width": 1400, "height": 1000}, "phone": {"width": 390, "height": 844}}
# (what changes, how): drop-downs of the README's layout, then a typed number
SELECTS = [("recompute", ["full", "none", "selective"]), ("zero", ["1", "2", "3", "0"]), ("pp", ["2", "8", "4"])]
TYPED = ("mbs", ["2", "1"])
TIMER = """(change) => new Promise((done) => {
    const before = Number(document.body.dataset.renders || 0);
    const seen = new MutationObserver(() => {
        if (Number(document.body.dataset.renders || 0) > before) { seen.disconnect(); done(performance.now() - t0); }
    });
    seen.observe(document.body, {attributes: true, attributeFilter: ['data-renders']});
    const t0 = performance.now();
    change();
})"""


def _server():
    import uvicorn

    from trainplan.web.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    while not srv.started:
        time.sleep(0.05)
    return srv, f"http://127.0.0.1:{port}"


def _select(page, name, value):
    return page.evaluate(TIMER.replace("change()", f"""(() => {{
        const s = document.querySelector('select[name={name}]'); s.value = '{value}';
        s.dispatchEvent(new Event('input', {{bubbles: true}})); s.dispatchEvent(new Event('change', {{bubbles: true}}));
    }})()"""))


def _type(page, name, value):
    return page.evaluate(TIMER.replace("change()", f"""(() => {{
        const e = document.querySelector('input[name={name}]'); e.value = '{value}';
        e.dispatchEvent(new Event('input', {{bubbles: true}}));
    }})()"""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--view", choices=sorted(VIEWS), default="desktop")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    srv, url = _server()
    times: dict[str, list[float]] = {"drop-down, first pass": [], "drop-down, cached": [],
                                     "typed number, first pass": [], "typed number, cached": []}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport=VIEWS[args.view])
        for r in range(args.rounds):
            # each round on its own sequence length: its plans are new to the server's cache
            page.goto(f"{url}/?model=llama-3-70b&gpus=64&tp=8&pp=4&zero=0&recompute=selective&gbs=64&sp=true"
                      f"&seq_len={4096 + 128 * r}")
            page.wait_for_function("document.body.dataset.state === 'ready'")
            for again in (False, True):
                kind = "cached" if again else "first pass"
                for name, values in SELECTS:
                    for value in values:
                        times[f"drop-down, {kind}"].append(_select(page, name, value))
                for value in TYPED[1]:
                    times[f"typed number, {kind}"].append(_type(page, TYPED[0], value))
        browser.close()
    srv.should_exit = True
    print(f"change -> readout in Chromium ({args.view}, {args.rounds} rounds), ms:")
    print(f"{'change':<30} {'n':>4} {'median':>8} {'p90':>8} {'max':>8}  target 150 ms")
    for kind, xs in times.items():
        xs = sorted(xs)
        p90 = xs[min(len(xs) - 1, int(0.9 * len(xs)))]
        print(f"{kind:<30} {len(xs):>4} {statistics.median(xs):>8.1f} {p90:>8.1f} {xs[-1]:>8.1f}  "
              f"median/target {statistics.median(xs) / 150:.2f}")


if __name__ == "__main__":
    main()
