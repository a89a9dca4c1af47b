#!/usr/bin/env python3
"""Times the lineage page in headless Chromium (bench/ui.sh): load-to-usable of the written file
and of `roar ui`, against the Graphviz SVG and a blank page in the same browser; then a search and
a lineage highlight, measured in the page up to the next painted frame.

usage: ui_bench.py WORKDIR URL LOADS
       ui_bench.py --reruns URL LOADS    (a store of re-runs: latest runs against all runs)
"""
import statistics
import sys

from playwright.sync_api import sync_playwright

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

LOADED = "() => performance.getEntriesByType('navigation')[0].loadEventEnd"
# After the page says it is drawn, two frames: the layout and paint of what it drew.
READY = """async () => {
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    return Math.max(Number(document.body.dataset.readyMs), performance.getEntriesByType('navigation')[0].loadEventEnd);
}"""
SEARCH = """async (q) => {
    const s = document.getElementById('search'); const t = performance.now();
    s.value = q; s.dispatchEvent(new Event('input'));
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    return [performance.now() - t, document.querySelectorAll('g.node.match').length];
}"""
HIGHLIGHT = """async () => {
    const n = [...document.querySelectorAll('g.node.file')].find(g => g.dataset.label === 'report.md');
    n.dispatchEvent(new MouseEvent('click', {bubbles: true}));
    const t = performance.now();
    document.querySelector('button[data-highlight=up]').click();
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    return [performance.now() - t, document.querySelectorAll('g.node.up').length];
}"""


# From the "all runs" box ticked to the frame after the whole graph is drawn.
ALL_RUNS = """async () => {
    const t = performance.now(), box = document.getElementById('all-runs');
    box.checked = true; box.dispatchEvent(new Event('change'));
    await new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
    return [performance.now() - t, document.querySelectorAll('g.node').length];
}"""


def reruns(url, loads):
    """The page of a store of re-runs opened (latest runs, the default), then all runs drawn."""
    latest, every, shown, drawn = [], [], 0, 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for i in range(loads + 1):  # the first round warms the browser's caches
            page = browser.new_page(viewport={"width": 1400, "height": 850})
            page.goto(url)
            page.wait_for_selector("body[data-ready-ms]")
            t = page.evaluate(READY)
            shown = page.evaluate("() => document.querySelectorAll('g.node').length")
            a, drawn = page.evaluate(ALL_RUNS)
            if i:
                latest.append(t)
                every.append(a)
            page.close()
        browser.close()
    m, a = statistics.median(latest), statistics.median(every)
    print(f"  opened (latest runs, {shown} nodes): usable after {m:8.1f} ms")
    print(f"  all runs ({drawn} nodes): drawn {a:8.1f} ms after the click ({a / m:.2f}x the page's whole opening)")


def main():
    if sys.argv[1] == "--reruns":
        return reruns(sys.argv[2], int(sys.argv[3]))
    w, url, loads = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pages = {
        "blank page": ("data:text/html,<p>x</p>", LOADED),
        "svg (graphviz)": (f"file://{w}/dag.svg", LOADED),
        "html file": (f"file://{w}/dag.html", READY),
        "roar ui": (url, READY),
    }
    times = {k: [] for k in pages}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        for _ in range(loads + 1):  # the first round warms the browser's caches
            for name, (target, probe) in pages.items():
                page = browser.new_page(viewport={"width": 1400, "height": 850})
                page.goto(target)
                if probe is READY:
                    page.wait_for_selector("body[data-ready-ms]")
                times[name].append(page.evaluate(probe))
                page.close()
        for v in times.values():
            v.pop(0)
        base = statistics.median(times["blank page"])
        svg = statistics.median(times["svg (graphviz)"])
        for name, v in times.items():
            m = statistics.median(v)
            print(f"  {name:16s} usable after {m:8.1f} ms  ({m / svg:.2f}x graphviz svg; +{m - base:.1f} ms over a blank page)")
        page = browser.new_page(viewport={"width": 1400, "height": 850})
        page.goto(f"file://{w}/dag.html")
        page.wait_for_selector("body[data-ready-ms]")
        nodes = page.evaluate("() => document.querySelectorAll('g.node').length")
        edges = page.evaluate("() => document.querySelectorAll('path.edge').length")
        print(f"  drawn: {nodes} nodes, {edges} edges")
        s = [page.evaluate(SEARCH, q) for q in ["epoch", "s1", "ckpt-4", "zzz"] * 3]
        print(f"  search (to the next frame): median {statistics.median(x[0] for x in s):.1f} ms over {len(s)} queries")
        page.evaluate("() => { document.getElementById('search').value = ''; document.getElementById('search').dispatchEvent(new Event('input')); }")
        h = page.evaluate(HIGHLIGHT)
        print(f"  'how was this made' of report.md: {h[0]:.1f} ms to the next frame, {h[1]} nodes highlighted")
        browser.close()


if __name__ == "__main__":
    main()
