"""The web console (GET /) in a real browser: headless Chromium driven by selenium against a
real attnd.

One browser for the module. The page exposes the numbers behind what it draws
(window.attnConsole, data-* attributes on chart points), so these tests assert numbers, not
pixels: O against float64, every heatmap row summing to 1, the masked cells, the plan chart
against GET /attention/plan, a 422's message, the live chart moving under `attn load`, and
the sessions panel against GET /v1/sessions, its delete button deleting.
Every test fails on a browser console error it did not expect and on any request the page
makes to another origin. Screenshots go to build/console/ (docs/ holds one of each part).

Needs Debian's chromium and chromium-driver (make deps) and selenium (the test venv); says
skipped only when they are missing.
"""

import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from attn_ref import BF16, reference, rel_err
from conftest import ROOT, _serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SHOTS = os.path.join(ROOT, "build", "console")
WAIT = 30  # seconds any one thing may take on a loaded machine; nothing is timed

try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait
    _missing = None
except ImportError as e:  # pragma: no cover - the venv has it
    _missing = "selenium is not installed (%s)" % e
if _missing is None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.access(path, os.X_OK):
            _missing = "%s is missing (make deps installs chromium and chromium-driver)" % path

if _missing:
    print("skipped: " + _missing)
    pytestmark = pytest.mark.skip(reason=_missing)


@pytest.fixture(scope="module")
def console_server(tmp_path_factory):
    yield from _serve(["--threads", "2"], tmp_path_factory)


def _options():
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1280,900", "--no-first-run", "--disable-background-networking",
              "--disable-component-update", "--disable-default-apps", "--disable-sync",
              "--disable-extensions"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return o


@pytest.fixture(scope="module")
def browser():
    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager must never reach the network
    d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=_options())
    d.set_script_timeout(WAIT)
    yield d
    d.quit()


@pytest.fixture
def page(browser, console_server, request):
    """The console freshly loaded; after the test, no unexpected console error and no request
    to another origin."""
    browser.set_window_size(1280, 900)
    browser.get(console_server.url + "/")
    wait(browser, "window.attnConsole && window.attnConsole.info !== null")
    browser.get_log("browser")  # what the page before this one still logged
    browser.get_log("performance")
    request.node.allowed_errors = []
    yield browser
    check_browser_logs(browser, console_server.url, request.node.allowed_errors)


def wait(d, js, timeout=WAIT):
    """Waits until the expression is truthy in the page; returns its value."""
    return WebDriverWait(d, timeout, poll_frequency=0.05).until(
        lambda drv: drv.execute_script("return (" + js + ");"))


def wait_row(d, selector, ready="true"):
    """Waits for a table row that matches selector and for which the expression ready (over
    the row, `tr`) holds; returns its cells' text and its meter's data-fill, read in the same
    script. The console rebuilds its tables on every poll, so a row found by one call and
    read by the next may be a row of an older poll, or gone."""
    return wait(d, """(() => {
        const tr = document.querySelector(%s);
        if (!tr || !(%s)) return null;
        const m = tr.querySelector('meter');
        return {cells: [...tr.cells].map(c => c.textContent.trim()),
                fill: m ? m.dataset.fill : null}; })()""" % (json.dumps(selector), ready))


def check_browser_logs(d, origin, allowed):
    """Fails on a SEVERE console entry not matching an allowed pattern, and on any request
    (performance log, and the page's own resource timing) to another origin."""
    severe = [e["message"] for e in d.get_log("browser") if e["level"] == "SEVERE"]
    unexpected = [m for m in severe if not any(re.search(p, m) for p in allowed)]
    assert not unexpected, "console errors: %s" % unexpected
    urls = []
    for e in d.get_log("performance"):
        msg = json.loads(e["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    urls += d.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name);")
    foreign = [u for u in urls if not (u.startswith(origin + "/") or u.startswith("data:"))]
    assert urls and not foreign, "requests to another origin: %s" % foreign


def set_value(d, elem_id, value):
    e = d.find_element(By.ID, elem_id)
    e.clear()
    e.send_keys(str(value))


def fill_shape(d, batch=1, heads=2, heads_kv=1, nq=48, nkv=64, dim=32, dtype="F32",
               causal=False, window=(-1, -1), seed=7):
    for eid, v in (("pg-batch", batch), ("pg-heads", heads), ("pg-heads-kv", heads_kv),
                   ("pg-nq", nq), ("pg-nkv", nkv), ("pg-d", dim), ("pg-wl", window[0]),
                   ("pg-wr", window[1]), ("pg-seed", seed)):
        set_value(d, eid, v)
    Select(d.find_element(By.ID, "pg-dtype")).select_by_visible_text(dtype)
    box = d.find_element(By.ID, "pg-causal")
    if box.is_selected() != causal:
        box.click()


def run_playground(d):
    d.execute_script("window.attnConsole.last = null;")
    d.find_element(By.ID, "pg-run").click()
    return wait(d, "window.attnConsole.last")


def tensor(t):
    return np.asarray(t["data"], np.float64).reshape(t["shape"])


def shot(d, elem_id, name):
    """The whole element: in a window tall enough that the page does not scroll."""
    os.makedirs(SHOTS, exist_ok=True)
    size = d.get_window_size()
    d.set_window_size(1280, 4000)
    try:
        d.find_element(By.ID, elem_id).screenshot(os.path.join(SHOTS, name + ".png"))
    finally:
        d.set_window_size(size["width"], size["height"])


# ---- the page itself ---------------------------------------------------------------------

def test_headers_allow_only_this_server(console_server):
    with urllib.request.urlopen(console_server.url + "/", timeout=10) as r:
        csp = r.headers["Content-Security-Policy"]
        assert r.headers["Content-Type"].startswith("text/html")
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        page = r.read().decode()
    directives = dict((p.strip().split(" ", 1) + [""])[:2] for p in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert directives["style-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    # nothing external and nothing inline in the page
    assert not re.search(r"(src|href)=\"(https?:)?//", page)
    assert "<script>" not in page and "style=" not in page


# ---- playground -----------------------------------------------------------------------

def check_heatmap(d, req, reply, b, h):
    """Selects (b, h); every row with a visible key sums to 1, masked cells are exactly the
    masked ones, and P matches float64."""
    Select(d.find_element(By.ID, "hm-b")).select_by_value(str(b))
    Select(d.find_element(By.ID, "hm-h")).select_by_value(str(h))
    heat = wait(d, "window.attnConsole.heat && window.attnConsole.heat.h === %d && "
                   "window.attnConsole.heat.b === %d && window.attnConsole.heat" % (h, b))
    p = np.asarray(heat["p"], np.float64)
    visible = np.asarray(heat["visible"], bool)
    q, k = tensor(req["q"]), tensor(req["k"])
    nq, nkv = q.shape[2], k.shape[2]
    assert p.shape == (nq, nkv)
    # the mask from docs/design.md, written again here
    wl, wr = req["window_left"], 0 if req["causal"] else req["window_right"]
    i, j = np.arange(nq)[:, None], np.arange(nkv)[None, :]
    off = nkv - nq
    want = np.ones((nq, nkv), bool)
    if wl >= 0:
        want &= j >= i + off - wl
    if wr >= 0:
        want &= j <= i + off + wr
    assert (visible == want).all(), "masked cells differ from the mask"
    assert (p[~want] == 0).all()
    rows = want.any(axis=1)
    assert rows.any()
    assert np.abs(p[rows].sum(axis=1) - 1).max() <= 1e-5
    # P itself against float64 standard attention
    kh = h // (q.shape[1] // k.shape[1])
    s = q[b, h] @ k[b, kh].T / np.sqrt(q.shape[3])
    s = np.where(want, s, -np.inf)
    ref = np.exp(s - s.max(axis=1, keepdims=True))
    ref /= ref.sum(axis=1, keepdims=True)
    assert rel_err(p[rows], ref[rows]) <= 1e-5


def test_playground_o_and_heatmap_against_float64(page):
    d = page
    fill_shape(d, batch=2, heads=2, heads_kv=1, nq=48, nkv=64, dim=32, causal=True,
               window=(20, -1))
    last = run_playground(d)
    assert last["status"] == 200, last["reply"]
    assert d.find_element(By.ID, "pg-http").text == "200"
    assert "total" in d.find_element(By.ID, "pg-timing").text
    req, reply = last["request"], last["reply"]
    o, m, l, _ = reference(tensor(req["q"]), tensor(req["k"]), tensor(req["v"]),
                           causal=True, window=(20, -1))
    assert rel_err(tensor(reply["o"]), o) <= 1e-5
    assert rel_err(tensor(reply["l"]), l) <= 1e-5
    for b, h in ((0, 0), (1, 1)):
        check_heatmap(d, req, reply, b, h)
    shot(d, "playground", "playground")


def test_playground_bf16_sends_what_the_server_holds(page):
    d = page
    fill_shape(d, heads=1, nq=16, nkv=16, dim=8, dtype="BF16", seed=3)
    last = run_playground(d)
    assert last["status"] == 200, last["reply"]
    req = last["request"]
    q = np.asarray(req["q"]["data"], np.float64)
    assert BF16 is not None
    assert (q.astype(np.float32).astype(BF16).astype(np.float64) == q).all()
    o, _, _, _ = reference(tensor(req["q"]), tensor(req["k"]), tensor(req["v"]))
    assert rel_err(tensor(last["reply"]["o"]), o) <= 8e-3
    check_heatmap(d, req, last["reply"], 0, 0)


def test_server_error_is_shown_with_code_and_message(page, request):
    d = page
    # the run's 422, and the plan's (it follows the shape, which the server refuses)
    request.node.allowed_errors = [r"/attention - .*422", r"/attention/plan\?.* - .*422"]
    fill_shape(d, heads=3, heads_kv=2, nq=4, nkv=4, dim=4)
    last = run_playground(d)
    assert last["status"] == 422
    err = d.find_element(By.ID, "pg-error")
    want = last["reply"]["error"]
    assert err.get_attribute("data-code") == want["code"] == "shape_mismatch"
    assert err.text == "422 %s: %s" % (want["code"], want["message"])
    assert "multiple" in err.text
    wait(d, "document.getElementById('plan-status').textContent.includes('the plan failed: 422')")


# ---- memory plan --------------------------------------------------------------------------

def test_plan_chart_matches_the_plan_endpoint(page, console_server):
    d = page
    fill_shape(d, batch=1, heads=4, heads_kv=2, dim=64, dtype="F16")
    d.find_element(By.ID, "plan-run").click()
    wait(d, "window.attnConsole.plan && window.attnConsole.plan.shape.heads === 4 && "
            "window.attnConsole.plan.shape.dtype === 'F16'")
    # read in one go: a redraw (the shape's fields also schedule one) replaces the points
    rows = d.execute_script("""return [...document.querySelectorAll('#plan-chart circle')]
        .map(c => [c.dataset.series, Number(c.dataset.n), Number(c.dataset.bytes)]);""")
    points = {(series, n): b for series, n, b in rows}
    assert len([k for k in points if k[0] == "standard"]) == 13  # 256 ... 2^20
    url = (console_server.url + "/attention/plan?batch=1&heads=4&heads_kv=2&seq_q=4096"
           "&head_dim=64&dtype=F16")
    with urllib.request.urlopen(url, timeout=10) as r:
        plan = json.load(r)["bytes"]
    assert points[("standard", 4096)] == plan["s_plus_p"]
    assert points[("flash", 4096)] == plan["m"] + plan["l"] + plan["workspace"]
    # the seed's point: N = 4096, D = 64, F32, one head: S + P = 128 MiB
    assert points[("seed", 4096)] == 128 << 20
    assert "128 MiB" in d.find_element(By.ID, "plan-chart").text
    ratio = d.find_element(By.ID, "plan-ratio").text
    assert "N = 4096" in ratio and "×" in ratio
    shot(d, "plan", "plan")


# ---- live ---------------------------------------------------------------------------------

def attn_bin():
    b = os.environ.get("ATTN_BIN") or os.path.join(
        os.path.dirname(os.environ.get("ATTND_BIN", os.path.join(ROOT, "build", "attnd"))),
        "attn")
    return b if os.path.isabs(b) else os.path.join(ROOT, b)


def test_live_chart_moves_under_load_without_layout_shift(page, console_server):
    d = page
    d.execute_script("""
        window.__shift = 0;
        new PerformanceObserver(l => { for (const e of l.getEntries())
          if (!e.hadRecentInput) window.__shift += e.value; })
          .observe({type: 'layout-shift', buffered: false});""")
    wait(d, "Number(document.getElementById('ch-rps').dataset.count) >= 1")
    assert d.find_element(By.ID, "live-backend").text == "cpu"
    assert d.find_element(By.ID, "live-kernel").text != "–"
    before = int(d.find_element(By.ID, "ch-rps").get_attribute("data-nonzero"))
    assert before == 0  # the page's own polling is not counted
    subprocess.run([attn_bin(), "load", console_server.url, "--concurrency", "2",
                    "--requests", "400", "--shape", "1,2,64,32", "--json"],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    # the poll after the load ends sees the requests
    wait(d, "Number(document.getElementById('ch-rps').dataset.nonzero) >= 1")
    assert float(d.find_element(By.ID, "ch-rps").get_attribute("data-max")) > 0
    wait(d, "Number(document.getElementById('ch-lat').dataset.max) > 0")
    assert d.find_element(By.CSS_SELECTOR, "#ch-rps polyline")
    # the charts, numbers and tables updated several times and nothing moved
    assert d.execute_script("return window.__shift") == 0
    shot(d, "live", "live")


def test_live_counts_errors_by_code(page, console_server):
    d = page
    # errors/s is the difference between two polls: an error before the first poll is in
    # its baseline and never shows as a rate (a slow page load under load did just that)
    wait(d, "window.attnConsole.live.polls >= 1")
    req = urllib.request.Request(console_server.url + "/attention", data=b"{",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    code = json.loads(e.value.read())["error"]["code"]
    got = wait_row(d, '#lv-codes tr[data-code="%s"]' % code)
    total = int(got["cells"][1])
    assert total >= 1
    wait(d, "Number(document.getElementById('ch-err').dataset.max) > 0")


# ---- sessions -----------------------------------------------------------------------------

def _call(url, method, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_sessions_panel_lists_fills_and_deletes(page, console_server):
    d = page
    base = console_server.url + "/v1/sessions/console-1"
    status, _ = _call(base, "PUT", {"heads_kv": 2, "head_dim": 4, "dtype": "BF16", "layers": 2,
                                    "max_tokens": 100})
    assert status == 201
    t = {"shape": [2, 3, 4], "dtype": "BF16", "data": [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0] * 2}
    status, reply = _call(base + "/attention", "POST",
                          {"q": t, "k": t, "v": t, "pos": 0, "layer": 1})
    assert status == 200, reply
    # a poll between the PUT and the POST lists the session empty: wait for one after both
    row = 'tr[data-id="console-1"]'
    got = wait_row(d, "#sess-table " + row, "tr.querySelector('meter').dataset.fill !== '0'")
    cells = got["cells"]
    assert cells[:4] == ["console-1", "BF16", "2 × 4", "2"]
    assert float(got["fill"]) == 3 / 200  # 3 tokens in layer 1 of 2 layers x 100
    assert cells[4] == "3 / 200"
    listed = wait(d, "(l => l && l.sessions.some(s => s.tokens > 0) && l.sessions)"
                     "(window.attnConsole.sessions)")
    assert [s["id"] for s in listed] == ["console-1"]
    # 2 x layers x heads_kv x one page (8192 tokens of 8 bytes) x 64 KiB
    assert listed[0]["reserved_bytes"] == 2 * 2 * 2 * 1 * 65536
    assert cells[5] == "512 KiB"
    # a fork shares the pages of layer 1 (2 heads, K and V: 4 pages): its row says so
    assert _call(base + "/fork", "POST", {"id": "console-2"})[0] == 201
    got = wait_row(d, '#sess-table tr[data-id="console-2"]', "true")
    assert got["cells"][5] == "512 KiB, 256 KiB shared"
    assert _call(console_server.url + "/v1/sessions/console-2", "DELETE")[0] == 204
    # found and clicked in one script, so the row is the one on the page
    d.execute_script("document.querySelector(arguments[0]).click()", "#sess-table " + row + " button")
    wait(d, "!document.querySelector('#sess-table %s')" % row)
    status, _ = _call(base, "GET")
    assert status == 404
    # the values' width beside it when it is not head_dim; a latent session says so
    made = []
    for sid, extra, text in (("console-dv", {"head_dim_v": 6}, "2 × 4, v 6"),
                             ("console-mla", {"v_from_k": 3}, "2 × 4, latent (v: 3)")):
        doc = dict({"heads_kv": 2, "head_dim": 4, "dtype": "BF16", "max_tokens": 8}, **extra)
        assert _call(console_server.url + "/v1/sessions/" + sid, "PUT", doc)[0] == 201
        made.append(sid)
        got = wait_row(d, '#sess-table tr[data-id="%s"]' % sid, "true")
        assert got["cells"][2] == text
    # a quantized session's dtype says how its rows are stored
    doc = {"heads_kv": 2, "head_dim": 4, "dtype": "BF16", "max_tokens": 8, "kv_dtype": "I8"}
    assert _call(console_server.url + "/v1/sessions/console-q", "PUT", doc)[0] == 201
    made.append("console-q")
    got = wait_row(d, '#sess-table tr[data-id="console-q"]', "true")
    assert got["cells"][1] == "BF16 (stored I8)"
    for sid in made:
        assert _call(console_server.url + "/v1/sessions/" + sid, "DELETE")[0] == 204


# ---- usable by everyone -----------------------------------------------------------------

def test_every_control_is_labelled_and_narrow_screens_fit(page):
    d = page
    unlabeled = d.execute_script("""
        return [...document.querySelectorAll('input, select, textarea, button')]
          .filter(e => !e.labels?.length && !e.getAttribute('aria-label') && !e.textContent.trim())
          .map(e => e.id);""")
    assert unlabeled == []
    d.set_window_size(390, 844)
    width = d.execute_script("return window.innerWidth")
    wait(d, "document.documentElement.clientWidth <= %d" % width)
    overflow = d.execute_script("return document.documentElement.scrollWidth - "
                                "document.documentElement.clientWidth")
    assert overflow <= 0, "the page is %d px wider than a 390-px screen" % overflow
    d.set_window_size(1280, 900)


def test_api_key_is_asked_once_and_kept_in_memory(browser, tmp_path_factory):
    gen = _serve(["--threads", "1", "--api-key", "s3cret"], tmp_path_factory)
    srv = next(gen)
    try:
        d = browser
        d.get(srv.url + "/")
        wait(d, "!document.getElementById('key-form').hidden")
        d.find_element(By.ID, "api-key").send_keys("s3cret")
        d.find_element(By.CSS_SELECTOR, "#key-form button").click()
        wait(d, "window.attnConsole.info !== null")
        assert "API key in use" in d.find_element(By.ID, "server-line").text
        wait(d, "window.attnConsole.plan !== null && window.attnConsole.live.polls >= 1")
        assert d.execute_script("return localStorage.length + sessionStorage.length") == 0
        assert d.execute_script("return document.cookie") == ""
        # the page asked once: only the first /v1/info was refused
        check_browser_logs(d, srv.url, [r"/v1/info - .*401"])
    finally:
        next(gen, None)
