"""The HTML reports opened in a real browser: headless Chromium runs each page's scripts, then
the test reads what it drew. The DOM after the scripts ran must hold one plotly chart (its
"main-svg" and traces with visible marks: bars, markers) for every chart div the page carries,
and the screenshot must not be blank and must show the marks the DOM says were drawn, in their
colours.

Chromium is a system package (`apt-get install chromium`; .ci/run installs it): without it
these tests fail, naming what is missing."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from test_compare import SLOW_FILL, STEADY, _envs_toml, _no_double_on_path, three_kernels

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
WINDOW = (1400, 3000)                # tall enough for every chart of these pages
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
BAR = re.compile(r"^M([-\d.e]+),([-\d.e]+)V([-\d.e]+)H([-\d.e]+)V([-\d.e]+)Z$")
MARKER = re.compile(r"^M([\d.]+),0A")                     # a circle marker of radius r
FILL = re.compile(r"fill:\s*rgb\((\d+),\s*(\d+),\s*(\d+)\)")


def browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is not installed (apt-get install chromium): the HTML reports cannot be "
                "checked in a browser", pytrace=False)


def _chromium(page: Path, *mode: str, timeout: float = 90, tries: int = 2) -> subprocess.CompletedProcess:
    # headless Chromium now and then never ends its virtual-time screenshot (seen once in ~30 runs
    # on an idle machine): a second browser, with a fresh profile, is asked before failing
    for attempt in range(tries):
        with tempfile.TemporaryDirectory(prefix="cudasnap-chromium-") as profile:
            try:
                cp = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu",
                                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                                     "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}",
                                     f"--window-size={WINDOW[0]},{WINDOW[1]}", "--virtual-time-budget=10000", *mode,
                                     page.resolve().as_uri()], capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                if attempt + 1 == tries:
                    raise
                continue
        assert cp.returncode == 0, f"chromium exit {cp.returncode}: {cp.stderr[-2000:]}"
        return cp


class _Charts(HTMLParser):
    """Per plotly chart div of the rendered DOM: its main-svg count, traces, and each mark's
    fill colour and inner area in px (plotly draws a bar as one path "M x0,y0 V y1 H x1 V y0 Z", a
    circle marker as a path "M r,0 A r,r ..." of class "point")."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list = []          # (tag, chart or None) per open element
        self.charts: list = []

    def _chart(self):
        for _tag, c in reversed(self.stack):
            if c is not None:
                return c
        return None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        chart = None
        if tag == "div" and "js-plotly-plot" in cls:
            chart = {"main_svg": 0, "traces": Counter(), "marks": []}
            self.charts.append(chart)
        c = self._chart()
        if c is not None:
            if tag == "svg" and "main-svg" in cls:
                c["main_svg"] += 1
            if tag == "g" and "trace" in cls:
                c["traces"][" ".join(x for x in cls if not x.startswith("trace"))] += 1
            if tag == "path":
                d, f = a.get("d") or "", FILL.search(a.get("style") or "")
                bar, marker = BAR.match(d), MARKER.match(d) if "point" in cls else None
                if f and (bar or marker):
                    if bar:
                        x0, _y0, y1, x1, y2 = map(float, bar.groups())
                        w, h = abs(x1 - x0), abs(y2 - y1)
                    else:
                        w = h = 2 * float(marker[1])
                    # the inside, 1 px in from each edge: anti-aliased edges take other colours
                    # (on a bar 3.5 px wide that is most of it)
                    area = max(0.0, w - 2) * max(0.0, h - 2) * (0.785 if marker else 1.0)
                    c["marks"].append(((int(f[1]), int(f[2]), int(f[3])), area, min(w, h)))
        if tag not in VOID:
            self.stack.append((tag, chart))

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i][0] == tag:
                del self.stack[i:]
                return


def check_rendered(page: Path, out_dir: Path, min_charts: int = 1) -> dict:
    """Render `page` in Chromium and check that every chart was drawn; returns what was seen."""
    source = page.read_text()
    divs = len(re.findall(r'<div id="[^"]+" class="plotly-graph-div"', source))
    assert divs >= min_charts, f"{page.name}: {divs} chart div(s) in the page"
    dom = _chromium(page, "--dump-dom").stdout
    parser = _Charts()
    parser.feed(dom)
    charts = parser.charts
    assert len(charts) == divs, f"{page.name}: plotly drew {len(charts)} of {divs} charts"
    for i, c in enumerate(charts):
        assert c["main_svg"] >= 1, f"{page.name}: chart {i} has no main-svg"
        assert sum(c["traces"].values()) >= 1, f"{page.name}: chart {i} has no trace"
        assert any(thick >= 3 for _rgb, _area, thick in c["marks"]), f"{page.name}: chart {i} has no visible mark: {c}"
    png = out_dir / (page.stem + ".png")
    _chromium(page, "--run-all-compositor-stages-before-draw", f"--screenshot={png}")
    img = Image.open(png).convert("RGB")
    assert img.size == WINDOW, img.size
    total = img.size[0] * img.size[1]
    pixels = Counter({rgb: n for n, rgb in img.getcolors(maxcolors=total)})
    background, bg_n = pixels.most_common(1)[0]
    assert background == (255, 255, 255), f"{png.name}: background {background}"
    # not blank (the chart checks below say what is drawn; a one-chart page's ink varies with its
    # data: the campaign page once drew 39 thousand px)
    assert total - bg_n > 20_000, f"{png.name}: {total - bg_n} non-background pixels: blank"
    assert len(pixels) > 50, f"{png.name}: {len(pixels)} colours"
    # every chart is on screen: each colour of the marks at least 3 px thick covers at least the
    # inside of its largest such mark (anti-aliased edges aside)
    largest = {}
    for rgb, area, thick in (m for c in charts for m in c["marks"]):
        if thick >= 3:
            largest[rgb] = max(area, largest.get(rgb, 0.0))
    for rgb, area in largest.items():
        assert pixels[rgb] >= 0.4 * area, f"{png.name}: colour {rgb} on {pixels[rgb]} px, the DOM's mark is {area:.0f}"
    return {"charts": charts, "png": png, "pixels": pixels, "largest": largest}


# --------------------------------------------------------------------------- the reports
def _cli(env, *args, timeout=300):
    return subprocess.run([sys.executable, "-m", "cudasnap", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=timeout)


def _double_env(double, extra=None):
    e = dict(double["env"])
    e.pop("CUDASNAP_REPLAY_TEST_BLOCK", None)
    e.update(extra or {})
    return e


@pytest.fixture(scope="module")
def snap(double, tmp_path_factory):
    return three_kernels(tmp_path_factory.mktemp("render") / "three.cusnap")


def compare_report(double, snap, d: Path) -> Path:
    profs = []
    for name, env in (("base", STEADY), ("slow", SLOW_FILL)):
        out = d / f"{name}.json"
        cp = _cli(_double_env(double, env), "replay", snap, "--profile", "isolated", "--repeat", "3", "--warmup", "1",
                  "--out", out, "-q")
        assert cp.returncode == 0, cp.stdout + cp.stderr
        profs.append(out)
    html = d / "compare.html"
    cp = _cli(_double_env(double), "compare", *profs, "--threshold", "15", "--html", html)
    assert cp.returncode == 1 and html.exists(), cp.stdout + cp.stderr
    return html


def bisect_report(double, snap, d: Path) -> Path:
    envs = _envs_toml(d / "envs.toml", double, ["r1", "r2", "r3"], slow_from=2)
    html = d / "bisect.html"
    cp = _cli(_no_double_on_path(double), "bisect", snap, "--envs", envs, "--repeat", "5", "--warmup", "1",
              "--threshold", "15", "--html", html)
    assert cp.returncode in (0, 1) and html.exists(), cp.stdout + cp.stderr
    assert "first bad environment: 'r2'" in cp.stdout, cp.stdout
    return html


def campaign_report(double, snap, d: Path) -> Path:
    probe = _cli(_double_env(double), "campaign", "report", "--help")
    if probe.returncode != 0:
        pytest.skip("`cudasnap campaign report` does not exist in this tree: its HTML report is not checked")
    camp = d / "campaign.toml"
    lib = Path(double["libdir"]) / "libcuda.so.1"
    camp.write_text(f'name = "render"\nbaseline = "plain"\n[rules]\nrepeats = 3\nwarmup = 1\nthreshold = 15.0\n'
                    f'confirm = false\nmax_reruns = 0\n[[snapshot]]\npath = "{snap}"\nprofile = "timeline"\n'
                    f'[[env]]\nname = "plain"\ndriver = "{lib}"\nvars = {{ CUDA_DOUBLE_SLOW = "*:1", '
                    f'CUDA_DOUBLE_SLOW_FLOOR_US = "2000" }}\n'
                    f'[[env]]\nname = "slow"\ndriver = "{lib}"\nvars = {{ CUDA_DOUBLE_SLOW = "*:1,fill:2", '
                    f'CUDA_DOUBLE_SLOW_FLOOR_US = "2000" }}\n')
    store = d / "store.sqlite"
    import ray                    # a private local runtime with one fake GPU; the CLI joins it by address
    saved = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    started = not ray.is_initialized()
    try:
        if started:
            ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
        cp = _cli(dict(_no_double_on_path(double), RAY_AUTH_MODE="disabled"), "campaign", "run", camp, "-o", store,
                  "--address", ray.get_runtime_context().gcs_address, timeout=600)
    finally:
        if started:
            ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved
    assert cp.returncode in (0, 1) and store.exists(), cp.stdout + cp.stderr
    html = d / "campaign.html"
    cp = _cli(_double_env(double), "campaign", "report", store, "--html", html)
    assert cp.returncode in (0, 1) and html.exists(), cp.stdout + cp.stderr
    return html


@pytest.mark.parametrize("make,charts,colours", [(compare_report, 1, 2), (bisect_report, 2, 2), (campaign_report, 1, 1)],
                         ids=["compare", "bisect", "campaign"])
def test_report_renders_in_chromium(double, snap, tmp_path, make, charts, colours):
    page = make(double, snap, tmp_path)
    seen = check_rendered(page, tmp_path, min_charts=charts)
    # compare and bisect: the slowed kernel's (environment's) bar has a colour of its own
    assert len({rgb for rgb, _a, _t in seen["charts"][0]["marks"]}) >= colours, seen["charts"][0]["marks"]


def test_a_page_whose_chart_fails_is_caught(tmp_path):
    """The check itself: a page whose plotly call never runs has chart divs but no chart."""
    page = tmp_path / "broken.html"
    page.write_text('<!DOCTYPE html><html><body><h1>report</h1>'
                    '<div id="x" class="plotly-graph-div" style="height:400px;width:100%;"></div>'
                    '<script>throw new Error("no plotly")</script></body></html>')
    with pytest.raises(AssertionError, match="plotly drew 0 of 1 charts"):
        check_rendered(page, tmp_path)
