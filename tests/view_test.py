"""`tiler view` over a real job: IIIF info.json and region/size arithmetic against the TIFFs' pixels (edges,
non-square regions, level choice, the area rule between levels), the refusals (traversal, encoded slashes, a
linked output, malformed IIIF: 4xx, never a file outside the job), the objects endpoint over a TIAToolbox-layout
store, and the page in a headless Chromium: the screenshot shows the labels' palette colours where the labels
are, the heatmap where the probabilities are and an object's outline where it is, at two zoom levels.
Usage: view_test.py TILER. Chromium with its WebDriver and Selenium (Debian's `chromium`, `chromium-driver`,
`python3-selenium`) are needed for the browser tests, which skip, saying so, where one is absent; a picture is
taken once the page says it is drawn (its body's data-drawn), not after a fixed time."""
import http.client
import json
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request
import zlib
from pathlib import Path

try:
    import numpy as np
    from PIL import Image
except ImportError:  # CMake's Python lacks NumPy or PIL: Debian's has both
    python = os.environ.get("TILER_PYTHON") or "/usr/bin/python3"
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        raise
    os.execv(python, [python, *sys.argv])

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import view_server  # noqa: E402  (scripts/: the one way the test and the bench start the server)

TILER = os.path.abspath(sys.argv.pop(1)) if len(sys.argv) > 1 and os.path.isfile(sys.argv[1]) else ""
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    webdriver = None
W, H = 1200, 900  # the input: level 0, then vips's levels of 600x450 and 300x225
VIRIDIS = [(0.0, 68, 1, 84), (0.2, 65, 68, 135), (0.4, 42, 120, 142), (0.6, 34, 168, 132), (0.8, 122, 209, 81),
           (1.0, 253, 231, 37)]
SQUARE = (500, 300, 200, 150)  # the store's one large object: x, y, w, h (level-0 pixels)


def heatmap(v):
    v = min(max(v, 0.0), 1.0)
    k = 1
    while k + 1 < len(VIRIDIS) and v > VIRIDIS[k][0]:
        k += 1
    a, b = VIRIDIS[k - 1], VIRIDIS[k]
    t = (v - a[0]) / (b[0] - a[0])
    return np.array([a[i] + t * (b[i] - a[i]) for i in (1, 2, 3)])


def level_pixels(tif, page):
    """The RGB pixels of a TIFF page, through vips (its own pyramid's levels)."""
    out = Path(tif).with_suffix(f".p{page}.png")
    subprocess.run(["vips", "copy", f"{tif}[page={page}]", str(out)], check=True)
    return np.asarray(Image.open(out).convert("RGB")).astype(np.float64)


def band_pixels(tif, band):
    """One float band of a TIFF's first page, through vips."""
    raw = Path(tif).with_suffix(f".b{band}.raw")
    subprocess.run(["vips", "extract_band", f"{tif}[page=0]", str(raw) + ".v", str(band)], check=True)
    subprocess.run(["vips", "rawsave", str(raw) + ".v", str(raw)], check=True)
    return np.fromfile(raw, dtype=np.float32)


def area_mean(level, x0, y0, f, w, h):
    """The area rule: output pixel (u, v) is the mean of level [x0 + u*f, x0 + (u+1)*f) x [...), weighted."""
    def weights(origin, count, limit):
        m = np.zeros((count, limit))
        for i in range(count):
            s0, s1 = origin + i * f, origin + (i + 1) * f
            for j in range(int(np.floor(s0)), min(int(np.ceil(s1)), limit)):
                m[i, j] = (min(j + 1, s1) - max(j, s0)) / f
        return m
    wy, wx = weights(y0, h, level.shape[0]), weights(x0, w, level.shape[1])
    return np.einsum("vy,yxc,ux->vuc", wy, level, wx)


def start_view(out, *flags, cwd=None):
    return view_server.start_view(TILER, out, *flags, cwd=cwd)


def make_store(path):
    """A store in TIAToolbox's SQLiteStore layout: a 200x150 box and two small ones, zlib-compressed WKB."""
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE metadata (key TEXT UNIQUE, value TEXT)")
    for k, v in (("version", "1.0.1"), ("compression", "zlib"), ("compression_level", 9)):
        con.execute("INSERT INTO metadata VALUES (?, ?)", (k, json.dumps(v)))
    con.execute("CREATE VIRTUAL TABLE rtree USING rtree(id, min_x, max_x, min_y, max_y)")
    con.execute("CREATE TABLE annotations(id INTEGER PRIMARY KEY, key TEXT UNIQUE, objtype TEXT, cx FLOAT NOT NULL, "
                "cy FLOAT NOT NULL, geometry BLOB, properties TEXT, area FLOAT NOT NULL)")
    boxes = [SQUARE, (50, 50, 20, 20), (1100, 800, 30, 30)]
    for k, (x, y, w, h) in enumerate(boxes, 1):
        ring = [(x, y), (x + w, y), (x + w, y + h), (x, y + h), (x, y)]
        wkb = struct.pack("<BII", 1, 3, 1) + struct.pack("<I", len(ring)) + b"".join(struct.pack("<dd", *p) for p in ring)
        con.execute("INSERT INTO annotations VALUES (?,?,?,?,?,?,?,?)",
                    (k, f"k{k}", "Polygon", x + w / 2, y + h / 2, zlib.compress(wkb, 9),
                     json.dumps({"type": "nucleus"}), w * h))
        con.execute("INSERT INTO rtree VALUES (?,?,?,?,?)", (k, x, x + w, y, y + h))
    con.commit()
    con.close()


class View(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not TILER:
            raise unittest.SkipTest("no tiler binary given")
        cls.tmp = Path(tempfile.mkdtemp(prefix="view_test_"))
        yy, xx = np.mgrid[0:H, 0:W]
        rgb = np.stack([(xx * 255 // W), (yy * 255 // H), ((xx + yy) % 256)], axis=-1).astype(np.uint8)
        for cx, cy, r in ((300, 300, 120), (800, 550, 180), (1000, 200, 90)):
            rgb[(xx - cx) ** 2 + (yy - cy) ** 2 < r * r] = (250, 250, 250)
        Image.fromarray(rgb).save(cls.tmp / "slide.png")
        cls.input = cls.tmp / "slide.tif"
        subprocess.run(["vips", "tiffsave", str(cls.tmp / "slide.png"), str(cls.input), "--tile", "--pyramid",
                        "--tile-width", "256", "--tile-height", "256"], check=True)
        cls.out = cls.tmp / "out"
        subprocess.run([TILER, "-i", str(cls.input), "-o", str(cls.out), "--save", "labels,probs", "--pyramid",
                        "--no_progress"], check=True, stdout=subprocess.DEVNULL)
        # The objects store (the store writer's file) and a linked "output" the server must not follow.
        make_store(cls.out / "slide_objects.db")
        os.symlink("/etc/passwd", cls.out / "slide_evil.tif")
        report = json.loads((cls.out / "report.json").read_text())
        report["images"][0]["outputs"]["objects_store"] = str(cls.out / "slide_objects.db")
        report["images"][0]["outputs"]["instances"] = str(cls.out / "slide_evil.tif")
        (cls.out / "report.json").write_text(json.dumps(report))
        cls.server, cls.port, cls.warnings = start_view(cls.out, "--cache_mb", "16")
        cls.url = f"http://127.0.0.1:{cls.port}/"
        cls.labels = np.asarray(Image.open(cls.out / "slide_labels.tif").convert("RGB")).astype(np.float64)
        cls.prob1 = band_pixels(cls.out / "slide_probs.tif", 1).reshape(H, W)

    @classmethod
    def tearDownClass(cls):
        if hasattr(cls, "server"):
            view_server.stop_view(cls.server)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def get(self, path):
        """(status, body) of a GET sent as written: no client-side normalisation of '..' or '%2F'."""
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.putrequest("GET", path, skip_accept_encoding=True)
        c.endheaders()
        r = c.getresponse()
        body = r.read()
        c.close()
        return r.status, body

    def png(self, path):
        status, body = self.get(path)
        self.assertEqual(status, 200, body[:200])
        tmp = self.tmp / "tile.png"
        tmp.write_bytes(body)
        return np.asarray(Image.open(tmp).convert("RGBA")).astype(np.float64)

    def test_images_and_info(self):
        status, body = self.get("/api/images")
        self.assertEqual(status, 200)
        images = json.loads(body)["images"]
        self.assertEqual(len(images), 1)
        im = images[0]
        self.assertEqual((im["width"], im["height"]), (W, H))
        self.assertTrue(im["id"].endswith("/iiif/0/input"))
        types = {l["type"]: l for l in im["layers"]}
        self.assertEqual(set(types), {"labels", "scores", "objects"}, "the linked output is left out")
        self.assertIn("slide_evil.tif': not served", self.warnings)
        self.assertEqual(types["objects"]["count"], 3)
        self.assertEqual(types["labels"]["classes"][1]["name"], "class_1")
        for base in (im["id"], types["labels"]["id"], types["scores"]["classes"][1]["id"]):
            status, body = self.get(base[base.index("/iiif/"):] + "/info.json")
            self.assertEqual(status, 200)
            info = json.loads(body)
            for key in ("@context", "id", "type", "protocol", "profile", "width", "height", "tiles", "sizes"):
                self.assertIn(key, info)
            self.assertEqual(info["type"], "ImageService3")
            self.assertEqual(info["id"], base)
            self.assertEqual((info["width"], info["height"]), (W, H))
            self.assertEqual(info["tiles"][0]["scaleFactors"], [1, 2, 4, 8])

    def test_regions_are_the_tiffs_pixels(self):
        level0, level1 = level_pixels(self.input, 0), level_pixels(self.input, 1)
        # Level 0 at the right and bottom edges, a region running past them clipped to the image.
        t = self.png("/iiif/0/input/1100,800,100,100/100,100/0/default.png")
        np.testing.assert_array_equal(t[..., :3], level0[800:900, 1100:1200])
        t = self.png("/iiif/0/input/1150,850,100,100/max/0/default.png")
        self.assertEqual(t.shape[:2], (50, 50))
        np.testing.assert_array_equal(t[..., :3], level0[850:900, 1150:1200])
        # Non-square, half size: level 1 as it is.
        t = self.png("/iiif/0/input/0,0,300,100/150,/0/default.png")
        self.assertEqual(t.shape[:2], (50, 150))
        np.testing.assert_array_equal(t[..., :3], level1[0:50, 0:150])
        t = self.png("/iiif/0/input/600,300,600,600/300,300/0/default.png")
        np.testing.assert_array_equal(t[..., :3], level1[150:450, 300:600])
        # A third: level 1 (the coarsest at least as fine) resampled by area, 1.5 of its pixels an output pixel.
        t = self.png("/iiif/0/input/300,150,600,300/200,100/0/default.png")
        expected = area_mean(level1, 150, 75, 1.5, 200, 100)
        self.assertLessEqual(np.abs(t[..., :3] - np.round(expected)).max(), 1)
        # Labels: the palette's colours, pixel for pixel at level 0.
        t = self.png("/iiif/0/labels/400,200,300,200/max/0/default.png")
        np.testing.assert_array_equal(t[..., :3], self.labels[200:400, 400:700])
        self.assertTrue((t[..., 3] == 255).all(), "class 0 is drawn, opaque")
        # Probabilities of class 1 through the colour map.
        t = self.png("/iiif/0/probs-1/0,0,64,64/64,64/0/default.png")
        want = np.array([[heatmap(v) for v in row] for row in self.prob1[0:64, 0:64]])
        self.assertLessEqual(np.abs(t[..., :3] - want).max(), 1)

    def test_refusals(self):
        for path in ("/iiif/0/input/../../../etc/passwd", "/viewer/../report.json", "/viewer/..%2F..%2Freport.json",
                     "/iiif/0/input%2Finfo.json", "/iiif/0/%2e%2e/info.json", "/report.json", "/slide_labels.tif",
                     "//etc/passwd", "/viewer/openseadragon/../../report.json", "/iiif/7/input/info.json",
                     "/iiif/0/instances/info.json", "/iiif/0/probs-9/info.json", "/viewer/nothing.js"):
            status, body = self.get(path)
            self.assertGreaterEqual(status, 400, path)
            self.assertLess(status, 500, path)
            self.assertNotIn(b"root:", body, path)
        for tile in ("0,0,100,100/100,100/90/default.png", "a,b,c,d/max/0/default.png", "0,0,100,100/^max/0/default.png",
                     "0,0,100,100/200,200/0/default.png", "5000,0,10,10/max/0/default.png",
                     "0,0,0,10/max/0/default.png", "0,0,100,100/100,100/0/default.gif", "0,0,100,100/0,/0/default.png",
                     "pct:0,0,200/max/0/default.png", "-1,0,10,10/max/0/default.png", "full/!10,/0/default.png",
                     "full/99999999999,/0/default.png"):
            status, body = self.get("/iiif/0/input/" + tile)
            self.assertEqual(status, 400, tile + ": " + body.decode(errors="replace"))
        status, _ = self.get("/api/objects?image=0&x=zero")
        self.assertEqual(status, 400)
        self.assertIsNone(self.server.poll(), "the server is still up")

    def test_refused_directories_and_the_host_warning(self):
        r = subprocess.run([TILER, "view", str(self.tmp / "nothing")], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("report.json", r.stderr)
        bad = self.tmp / "bad"
        bad.mkdir(exist_ok=True)
        (bad / "report.json").write_text(json.dumps({"images": [{"input": str(self.tmp / "gone.tif")}]}))
        r = subprocess.run([TILER, "view", str(bad)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("names no image whose input can be read", r.stderr)
        (bad / "report.json").write_text("[1, 2")
        r = subprocess.run([TILER, "view", str(bad)], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not a tiler report", r.stderr)
        server = subprocess.Popen([TILER, "view", str(self.out), "--port", "0", "--host", "0.0.0.0"],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            first = server.stdout.readline()
            self.assertIn("serving on 0.0.0.0, not only this machine", first)
        finally:
            view_server.stop_view(server)

    def test_requests_past_the_queue_answer_503(self):
        import socket
        server, port, _ = start_view(self.out, "--threads", "1")
        idle = []
        try:
            # One connection holds the one thread (it sends nothing), 64 wait in the queue: the next is refused.
            for _ in range(65):
                idle.append(socket.create_connection(("127.0.0.1", port)))
                time.sleep(0.01)
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/api/images")
            r = c.getresponse()
            body = r.read()
            self.assertEqual(r.status, 503, body[:200])
            self.assertIn(b"busy", body)
        finally:
            for s in idle:
                s.close()
            view_server.stop_view(server)

    def test_a_relative_input_is_found_from_anywhere(self):
        # The job names its input relative to where it ran; the viewer runs elsewhere.
        job = self.tmp / "relative_job"
        job.mkdir(exist_ok=True)
        shutil.copy(self.input, job / "rel.tif")
        subprocess.run([TILER, "-i", "rel.tif", "-o", "out", "--save", "labels", "--no_progress"], cwd=job,
                       check=True, stdout=subprocess.DEVNULL)
        server, port, _ = start_view(job / "out", cwd="/")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("GET", "/api/images")
            r = c.getresponse()
            images = json.loads(r.read())
            self.assertEqual(r.status, 200)
            self.assertEqual(len(images["images"]), 1, images)
        finally:
            view_server.stop_view(server)

    def test_objects_by_viewport(self):
        status, body = self.get("/api/objects?image=0&x=450&y=250&w=100&h=100")
        j = json.loads(body)
        self.assertEqual(j["mode"], "outlines")
        self.assertEqual([o["id"] for o in j["objects"]], [1])
        self.assertEqual(j["objects"][0]["rings"][0][0], [500.0, 300.0])
        self.assertEqual(j["objects"][0]["class"], "nucleus")
        j = json.loads(self.get("/api/objects?image=0&limit=2")[1])
        self.assertEqual(j["mode"], "centroids")
        # Each of the 16 x 16 cells gives its first centroid: all three, each once.
        self.assertEqual(sorted(p[:2] for p in j["points"]), [[60.0, 60.0], [600.0, 375.0], [1115.0, 815.0]])
        self.assertEqual(j["cells"], 16)

    def test_a_classifiers_window_scores_as_a_grid(self):
        out = self.tmp / "cls"
        model = Path(TILER).resolve().parent.parent / "samples/models/classifier.pt"
        if not model.exists():
            model = Path(__file__).resolve().parent.parent / "samples/models/classifier.pt"
        subprocess.run([TILER, "-i", str(self.input), "-o", str(out), "-m", str(model), "--task", "classify",
                        "--activation", "softmax", "--save", "heatmap", "--no_progress"], check=True,
                       stdout=subprocess.DEVNULL)
        # The sample classifier scores every window alike: the heatmap is rewritten with a value a cell (its
        # size and description kept), so that a cell shown out of place shows.
        heat = out / "slide_heatmap.tif"
        columns, rows = (W + 255) // 256, (H + 255) // 256
        description = subprocess.run(["tiffinfo", str(heat)], capture_output=True, text=True).stdout
        description = re.search(r"ImageDescription: (.*)", description).group(1)
        values = np.zeros((rows, columns, 2), np.float32)
        values[..., 1] = np.arange(rows * columns).reshape(rows, columns) / (rows * columns - 1)
        values[..., 0] = 1 - values[..., 1]
        raw = self.tmp / "heat.raw"
        values.tofile(raw)
        subprocess.run(["vips", "rawload", str(raw), str(self.tmp / "heat.v"), str(columns), str(rows), "2",
                        "--format", "float"], check=True)
        heat.unlink()
        subprocess.run(["vips", "tiffsave", str(self.tmp / "heat.v"), str(heat)], check=True)
        subprocess.run(["tiffset", "-s", "270", description, str(heat)], check=True)
        scores = band_pixels(heat, 1)
        server, port, _ = start_view(out)
        try:
            images = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/images").read())["images"]
            grid = next(l for l in images[0]["layers"] if l["type"] == "grid")
            columns, rows = grid["width"], grid["height"]
            self.assertEqual(len(scores), columns * rows)
            scores = scores.reshape(rows, columns)
            # 256 px windows, no overlap: the stride is the window, the grid starts at the origin.
            self.assertEqual(grid["place"], {"x": 0.0, "y": 0.0, "width": columns * 256.0})
            self.assertEqual([c["name"] for c in grid["classes"]], ["class_0", "class_1"])
            shot = self.screenshot("panel=0&layers=grid&class=1&opacity_grid=1&view=0,0,1200,900", "grid",
                                   url=f"http://127.0.0.1:{port}/")
            for r in range(rows):
                for c in range(columns):
                    ix, iy = c * 256 + 128, r * 256 + 128
                    if ix >= W or iy >= H:
                        continue
                    got = shot[int(iy / 1.5), int(ix / 1.5)]
                    self.assertLessEqual(np.abs(got - heatmap(float(scores[r, c]))).max(), 2, f"cell ({c}, {r})")
        finally:
            view_server.stop_view(server)

    def screenshot(self, query, name, url=None):
        if not (CHROMIUM and CHROMEDRIVER and webdriver):
            self.skipTest("chromium, its driver or selenium is not installed (Debian: apt-get install chromium "
                          "chromium-driver python3-selenium)")
        shot = self.tmp / f"{name}.png"
        keep = os.environ.get("TILER_VIEW_SCREENSHOTS")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                     "--force-device-scale-factor=1", "--window-size=800,600",
                     f"--user-data-dir={self.tmp / 'chromium'}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        try:
            # The page's 800 x 600 CSS pixels, whatever the browser's window keeps for itself.
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                   {"width": 800, "height": 600, "deviceScaleFactor": 1, "mobile": False})
            driver.get((url or self.url) + "?size=800x600&" + query)
            WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.drawn === '1'"))
            driver.save_screenshot(str(shot))
        finally:
            driver.quit()
        if keep:
            shutil.copy(shot, Path(keep) / shot.name)
        return np.asarray(Image.open(shot).convert("RGB")).astype(np.float64)

    def uniform_points(self, image, view, scale, step=37):
        """Screen points whose image neighbourhood (3 image pixels each way) is one colour in `image`."""
        x0, y0 = view
        for sy in range(10, 590, step):
            for sx in range(10, 790, step):
                ix, iy = int(x0 + (sx + 0.5) * scale), int(y0 + (sy + 0.5) * scale)
                r = max(3, int(2 * scale))
                patch = image[max(0, iy - r):iy + r + 1, max(0, ix - r):ix + r + 1]
                if patch.size and (patch == patch[0, 0]).all():
                    yield sx, sy, patch[0, 0]

    def check_colours(self, shot, image, view, scale, tolerance=3):
        checked = 0
        colours = set()
        for sx, sy, want in self.uniform_points(image, view, scale):
            got = shot[sy, sx]
            self.assertLessEqual(np.abs(got - want).max(), tolerance, f"screen ({sx}, {sy}): {got} != {want}")
            checked += 1
            colours.add(tuple(want))
        self.assertGreater(checked, 50)
        return colours

    def test_page_shows_the_labels_at_two_zooms(self):
        shot = self.screenshot("panel=0&layers=labels&opacity_labels=1&view=0,0,1200,900", "labels_whole")
        colours = self.check_colours(shot, self.labels, (0, 0), 1.5)
        self.assertGreaterEqual(len(colours), 2, "both classes seen")
        shot = self.screenshot("panel=0&layers=labels&opacity_labels=1&view=600,350,400,300", "labels_zoomed")
        self.check_colours(shot, self.labels, (600, 350), 0.5)

    def test_page_shows_the_heatmap(self):
        shot = self.screenshot("panel=0&layers=probs&class=1&opacity_probs=1&view=0,0,1200,900", "heatmap")
        checked = 0
        for sy in range(10, 590, 41):
            for sx in range(10, 790, 41):
                ix, iy = int((sx + 0.5) * 1.5), int((sy + 0.5) * 1.5)
                # The colour map clamps to [0, 1] (the sample model's maps are not activated).
                patch = np.clip(self.prob1[max(0, iy - 4):iy + 5, max(0, ix - 4):ix + 5], 0, 1)
                if patch.max() - patch.min() < 0.02:
                    want = heatmap(float(patch.mean()))
                    self.assertLessEqual(np.abs(shot[sy, sx] - want).max(), 8, f"screen ({sx}, {sy})")
                    checked += 1
        self.assertGreater(checked, 30)

    def test_page_shows_an_objects_outline(self):
        for view, scale, name in (((0, 0), 1.5, "objects_whole"), ((400, 225, ), 0.5, "objects_zoomed")):
            w, h = 800 * scale, 600 * scale
            shot = self.screenshot(f"panel=0&layers=objects&view={view[0]},{view[1]},{w:g},{h:g}", name)
            x, y, bw, bh = SQUARE
            cyan = np.array([0, 255, 255])
            # Along the box's top and left edges: the outline's colour; at its centre: none.
            sx = lambda ix: int(round((ix - view[0]) / scale))
            sy = lambda iy: int(round((iy - view[1]) / scale))
            on_top = [shot[sy(y), sx(x + bw * f)] for f in (0.25, 0.5, 0.75)]
            on_left = [shot[sy(y + bh * f), sx(x)] for f in (0.25, 0.5, 0.75)]
            for p in on_top + on_left:
                self.assertLessEqual(np.abs(p - cyan).max(), 40, f"{name}: {p}")
            centre = shot[sy(y + bh / 2), sx(x + bw / 2)]
            self.assertGreater(np.abs(centre - cyan).max(), 100, name)


if __name__ == "__main__":
    unittest.main()
