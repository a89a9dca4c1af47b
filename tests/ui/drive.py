"""Drives the lineage page of `roar ui` / `roar dag --html` in headless Chromium (Debian's package)
with Playwright, as a user would, and checks what it shows. Called by tests/tests/suite/ui.rs.

    drive.py served URL PROJECT ROAR EXPECT.json SHOT.png
    drive.py file   PATH.html PROJECT ROAR EXPECT.json SHOT.png

EXPECT.json (written by the Rust test from the store) names the pipeline's files and hashes. Any
failed check raises; the exit status is the verdict.
"""

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

from playwright.sync_api import sync_playwright

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium tries Google's hosts at every start.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def status_of(url, headers=None):
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {})) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def token_required(url):
    base, token = url.split("?token=")
    for path in ["", "api/dag", "api/job/1", "api/events", "api/status"]:
        code, _ = status_of(base + path)
        check(code == 401, f"/{path} without a token answered {code}")
        code, _ = status_of(base + path + "?token=" + "0" * len(token))
        check(code == 401, f"/{path} with a wrong token answered {code}")
    code, body = status_of(base + "api/dag", {"Authorization": "Bearer " + token})
    check(code == 200, f"/api/dag with the token answered {code}")
    return json.loads(body)


def nodes(page, cls):
    """The labels (first line: `job N`, a path, `dir/`) of the graph nodes of class `cls`."""
    return page.eval_on_selector_all(f"g.node.{cls}", "els => els.map(e => e.dataset.label)")


def node(page, label):
    return page.locator(f"g.node[data-label={json.dumps(label)}]")


def not_blank(page, png):
    """Decodes the screenshot in the browser and counts what is drawn: not one flat colour."""
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return page.evaluate(
        """async (url) => {
            const img = new Image(); img.src = url; await img.decode();
            const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
            const g = c.getContext('2d'); g.drawImage(img, 0, 0);
            const d = g.getImageData(0, 0, c.width, c.height).data;
            const colours = new Set(); let ink = 0;
            for (let i = 0; i < d.length; i += 4) {
                colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
                if (d[i] + d[i + 1] + d[i + 2] < 600) ink++;
            }
            return { colours: colours.size, ink: ink / (d.length / 4) };
        }""",
        url,
    )


def explore(page, expect, shot):
    """What both modes must do: the graph, search, details, lineage highlight, expand, compare."""
    page.wait_for_selector("body[data-ready]")
    jobs = nodes(page, "job")
    check(len(jobs) == expect["jobs"], f"{len(jobs)} job nodes, expected {expect['jobs']}: {jobs}")

    # Search a file by name, pick it: its details show its hash and its producer.
    page.fill("#search", expect["target"])
    page.wait_for_selector("#results li")
    first = page.inner_text("#results li")
    check(expect["target"] in first, f"first search result is {first!r}")
    page.keyboard.press("Enter")
    details = page.inner_text("#details")
    check(expect["target_hash"] in details, f"details lack the hash {expect['target_hash']}: {details}")
    check(f"job {expect['target_job']}" in details, f"details lack the producer: {details}")
    check(page.locator("g.node.sel").count() == 1, "one node is selected")

    # Search by hash prefix finds the same node.
    page.fill("#search", expect["target_hash"][:10])
    page.wait_for_selector("#results li")
    check(expect["target"] in page.inner_text("#results li"), "hash prefix search")
    page.keyboard.press("Escape")

    # How was this made: exactly the upstream lineage is highlighted.
    page.click("button[data-highlight=up]")
    up = nodes(page, "up")
    check(sorted(up) == sorted(expect["upstream"]), f"highlighted upstream {up}, expected {expect['upstream']}")
    check(page.locator("path.edge.up").count() >= len(expect["upstream"]) - 1, "edges highlighted")
    check(page.eval_on_selector("#svg", "s => s.classList.contains('dim')"), "the rest is dimmed")
    png = page.screenshot(path=shot)
    drawn = not_blank(page, png)
    check(drawn["colours"] > 20 and drawn["ink"] > 0.005, f"screenshot looks blank: {drawn}")

    # What depends on this: the downstream of the first job includes the target.
    page.click("#clear")
    page.click("#fit")
    node(page, f"job {expect['first_job']}").click()
    page.click("button[data-highlight=down]")
    down = nodes(page, "down")
    check(expect["target"] in down, f"target not downstream of job {expect['first_job']}: {down}")

    # Pan and zoom: the wheel zooms about the pointer, a drag on the background pans.
    transform = lambda: page.get_attribute("#viewport", "transform")
    page.click("#fit")
    before = transform()
    box = page.locator("#svg").bounding_box()
    page.mouse.move(box["x"] + 20, box["y"] + 20)
    page.mouse.wheel(0, -400)
    zoomed = transform()
    check(zoomed != before and float(zoomed.split("scale(")[1].rstrip(")")) > float(before.split("scale(")[1].rstrip(")")), f"wheel did not zoom in: {before} -> {zoomed}")
    page.mouse.down()
    page.mouse.move(box["x"] + 120, box["y"] + 70, steps=5)
    page.mouse.up()
    check(transform() != zoomed and transform().split("scale(")[1] == zoomed.split("scale(")[1], f"drag did not pan: {zoomed} -> {transform()}")
    page.click("#fit")

    # A collapsed directory expands on click.
    before = page.locator("g.node.file").count()
    node(page, expect["collapsed_dir"] + "/").click()
    after = page.locator("g.node.file").count()
    check(after >= before + expect["collapsed_files"], f"expanding added {after - before} file nodes")

    # Two jobs side by side: select one, Compare with..., click the other.
    page.click("#clear")
    page.click("#fit")
    node(page, f"job {expect['first_job']}").click()
    page.click("#compare-with")
    node(page, f"job {expect['last_job']}").click()
    page.wait_for_selector("#compare:not([hidden]) table")
    compared = page.inner_text("#compare")
    check("argv" in compared and f"job {expect['first_job']}" in compared, f"compare panel: {compared}")
    page.keyboard.press("Escape")


def hostile(page, expect):
    """Recorded names that look like markup stay text."""
    page.fill("#search", "onerror")
    page.wait_for_selector("#results li")
    check(expect["hostile"] in page.inner_text("#results"), "the hostile name is shown as written")
    check(page.locator("img").count() == 0, "a recorded name became markup")


def served(url, project, roar, expect, shot):
    dag = token_required(url)
    check(dag == expect["dag"], "/api/dag is not what `roar dag --json` prints")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 850})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: errors.append("dialog: " + d.message))
        page.goto(url)
        explore(page, expect, shot)
        hostile(page, expect)

        # Live: a job recorded while the page is open appears, and a changed input marks what
        # depends on it as stale.
        page.wait_for_selector("#live.on")
        with open(f"{project}/{expect['root_input']}", "a") as f:
            f.write("changed\n")
        subprocess.run([roar, "run", "--", "sh", "-c", "echo late > late.txt"], cwd=project, check=True, capture_output=True)
        # (No wait_for_function: the page's CSP forbids the eval it needs, as it should.)
        page.wait_for_selector(f'g.node.job[data-label="job {expect["jobs"] + 1}"]', timeout=15000)
        page.wait_for_selector("g.node.job.stale", timeout=15000)
        check(len(nodes(page, "modified")) >= 1, "the changed root input is not marked modified")
        stale = nodes(page, "job.stale")
        check(len(stale) >= 1, f"no job marked stale after its input changed: {stale}")
        check(not errors, f"page errors: {errors}")
        browser.close()


def from_disk(path, expect, shot):
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 850})
        requests = []

        def gate(route):
            requests.append(route.request.url)
            if route.request.url.startswith("file://"):
                route.continue_()
            else:
                route.abort()

        context.route("**/*", gate)
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("dialog", lambda d: errors.append("dialog: " + d.message))
        page.goto("file://" + path)
        explore(page, expect, shot)
        hostile(page, expect)
        check(all(u.startswith("file://") for u in requests), f"the file fetched {requests}")
        check(not errors, f"page errors: {errors}")
        browser.close()


def steps(path, expect, shot):
    """A job with steps, from a written file: one node per step, and the lineage of the last
    output goes step to step."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 850})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto("file://" + path)
        page.wait_for_selector("body[data-ready]")
        jobs = nodes(page, "job")
        check(sorted(jobs) == sorted(expect["step_nodes"]), f"job nodes {jobs}, expected {expect['step_nodes']}")
        page.fill("#search", expect["target"])
        page.wait_for_selector("#results li")
        page.keyboard.press("Enter")
        page.click("button[data-highlight=up]")
        up = nodes(page, "up")
        check(sorted(up) == sorted(expect["upstream"]), f"highlighted upstream {up}, expected {expect['upstream']}")
        page.screenshot(path=shot)
        check(not errors, f"page errors: {errors}")
        browser.close()


# Every label inside the graph's window, as rendered: font size times the view's scale.
LABEL_SIZES = """() => {
    const box = document.getElementById('svg').getBoundingClientRect(), out = [];
    for (const t of document.querySelectorAll('g.node text')) {
        const r = t.getBoundingClientRect();
        if (r.right < box.left || r.left > box.right || r.bottom < box.top || r.top > box.bottom) continue;
        out.push(parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a);
    }
    return out;
}"""


def scale(url, expect, shot):
    """A store of many re-runs: the latest runs by default, legible, counted as jobs; all runs on
    request. Prints the page's timings as JSON (bench/ui.sh reads them)."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 850})
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        start = time.monotonic()
        page.goto(url)
        page.wait_for_selector("body[data-ready]", timeout=120000)
        loaded_ms = (time.monotonic() - start) * 1000
        drawn_ms = float(page.get_attribute("body", "data-ready-ms"))
        jobs = nodes(page, "job")
        check(len(jobs) == expect["latest_jobs"], f"{len(jobs)} job nodes by default, expected the {expect['latest_jobs']} latest")
        count = page.inner_text("#count")
        check(f"{expect['latest_jobs']} of {expect['jobs']} jobs" in count, f"header says {count!r}")
        sizes = page.evaluate(LABEL_SIZES)
        check(len(sizes) >= 10, f"only {len(sizes)} labels in view")
        check(min(sizes) >= 11, f"labels drawn at {min(sizes):.1f} px at the default view")
        titles = page.eval_on_selector_all("g.node.job text.title", "els => els.map(e => e.textContent)")
        folded = [t for t in titles if f"+{expect['earlier']} earlier" in t]
        check(len(folded) == expect["latest_jobs"], f"folded counts on {titles}")
        missing = nodes(page, "job.missing")
        check(missing == [f"job {expect['outputs_deleted']}"], f"jobs marked outputs-deleted: {missing}")
        png = page.screenshot(path=shot)
        drawn = not_blank(page, png)
        check(drawn["colours"] > 20 and drawn["ink"] > 0.005, f"screenshot looks blank: {drawn}")

        # A label finds its job; the job's runs open as a table.
        page.fill("#search", expect["label"])
        page.wait_for_selector("#results li")
        check(expect["labelled"] in page.inner_text("#results li"), "search by label")
        page.keyboard.press("Enter")
        page.wait_for_selector("#details span.label")
        check(expect["label"] in page.inner_text("#details"), "the label is not in the details")
        page.click("#show-runs", timeout=15000)
        rows = lambda: page.locator("#runs-table table.runs tr[data-job]").count()
        check(rows() == expect["runs"], f"{rows()} rows in the runs of {expect['runs_name']}")
        page.fill("#runs-filter", expect["label"])
        check(rows() == 1, f"{rows()} rows filtered by the label")
        page.fill("#runs-filter", "")
        page.click("#runs-table th >> text=job")
        first = page.get_attribute("#runs-table tr[data-job]", "data-job")
        page.click("#runs-table th >> text=job")
        check(page.get_attribute("#runs-table tr[data-job]", "data-job") != first, "sorting by job did not reverse")
        ticks = page.locator("#runs-table tr[data-job] input[type=checkbox]")
        ticks.nth(0).check()
        ticks.nth(1).check()
        page.click("#runs-compare")
        page.wait_for_selector("#compare:not([hidden]) table")
        page.screenshot(path=shot.replace(".png", "-runs.png"))
        page.keyboard.press("Escape")
        page.keyboard.press("Escape")
        check(page.locator("#runs-table").is_hidden(), "the runs table did not close")

        start = time.monotonic()
        page.check("#all-runs")
        page.wait_for_selector(f'g.node.job[data-label="job 1"]', timeout=120000)
        all_ms = (time.monotonic() - start) * 1000
        jobs = nodes(page, "job")
        check(len(jobs) == expect["jobs"], f"{len(jobs)} job nodes with all runs, expected {expect['jobs']}")
        files = page.locator("g.node.file").count()
        check(files >= expect["versions"], f"{files} file nodes with all runs, expected {expect['versions']}+")
        count = page.inner_text("#count")
        check(count.startswith(f"{expect['jobs']} jobs"), f"header says {count!r}")
        page.screenshot(path=shot.replace(".png", "-all.png"))
        check(not errors, f"page errors: {errors}")
        browser.close()
        print(json.dumps({"loaded_ms": round(loaded_ms, 1), "drawn_ms": drawn_ms, "all_runs_ms": round(all_ms, 1), "nodes_all": len(jobs) + files}))


if __name__ == "__main__":
    mode = sys.argv[1]
    target, project, roar = sys.argv[2], sys.argv[3], sys.argv[4]
    with open(sys.argv[5]) as f:
        expect = json.load(f)
    shot = sys.argv[6]
    if mode == "served":
        served(target, project, roar, expect, shot)
    elif mode == "steps":
        steps(target, expect, shot)
    elif mode == "scale":
        scale(target, expect, shot)
    else:
        from_disk(target, expect, shot)
    print("ok")
