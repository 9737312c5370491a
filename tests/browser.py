"""Headless Chromium (Debian's ``chromium``, installed by scripts/setup) for tests: a page's
rendered DOM and screenshot in one launch, and a check that each host's timeline on a gpuk8s
run page (gpuk8s/htmlreport.py) is actually drawn.

A missing Chromium is an error (:class:`BrowserMissing`), never a skip."""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from html.parser import HTMLParser
from itertools import accumulate
from operator import add
from pathlib import Path

from gpuk8s.htmlreport import COLOURS

#: the page's own CSP is kept; only this script (allowed by its hash) is added. It records
#: where each host's section is and how many of its bars have a box, and counts the page's
#: scripts and on* attributes (an escaping failure would add some)
MEASURE = """
for (const s of document.querySelectorAll('section.host')) {
  const r = s.getBoundingClientRect();
  const bars = [...s.querySelectorAll('.bar')].filter(b => {
    const q = b.getBoundingClientRect(); return q.width >= 1 && q.height >= 1; });
  s.setAttribute('data-box', [r.left, r.top + scrollY, r.width, r.height]
    .map(Math.round).join(','));
  s.setAttribute('data-bars', bars.length);
}
const handlers = [...document.querySelectorAll('*')].filter(e =>
  [...e.attributes].some(a => a.name.toLowerCase().startsWith('on'))).length;
document.body.setAttribute('data-measured',
  [document.scripts.length, handlers, document.documentElement.scrollHeight].join(','));
"""
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--force-device-scale-factor=1", "--no-first-run", "--disable-extensions",
         "--mute-audio")


class BrowserMissing(AssertionError):
    """No chromium on PATH: scripts/setup installs it (apt-get install -y chromium)."""


def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        raise BrowserMissing("chromium is not installed: run scripts/setup "
                             "(or apt-get install -y chromium); browser tests never skip")
    return path


@dataclass
class Box:
    x: int
    y: int
    w: int
    h: int
    bars: int  # bars with a non-empty box in the DOM


@dataclass
class Rendered:
    dom: str
    hosts: dict[str, Box]  # section id -> where it is drawn
    scripts: int  # <script> elements, the measuring one included
    handlers: int  # elements with an on* attribute
    png: Png


def _instrumented(page: str) -> str:
    """The page plus MEASURE, with MEASURE's hash added to the page's own CSP."""
    digest = base64.b64encode(hashlib.sha256(MEASURE.encode()).digest()).decode()
    page, n = re.subn(r'(http-equiv="Content-Security-Policy" content="[^"]*)"',
                      lambda m: f"{m[1]}; script-src 'sha256-{digest}'\"", page, count=1)
    assert n == 1, "the page has no Content-Security-Policy meta"
    return page.replace("</body>", f"<script>{MEASURE}</script></body>", 1)


def render(page: Path, *, width: int = 1200, height: int = 900,
           timeout: float = 90) -> Rendered:
    """Load ``page`` (a file) in headless Chromium once: its DOM after load and a
    ``width`` x ``height`` screenshot."""
    exe = chromium()
    with tempfile.TemporaryDirectory(prefix="gpuk8s-chromium-") as tmp:
        copy = Path(tmp) / "page.html"
        copy.write_text(_instrumented(page.read_text(encoding="utf-8")), encoding="utf-8")
        shot = Path(tmp) / "shot.png"
        proc = subprocess.run(
            [exe, *FLAGS, f"--user-data-dir={tmp}/profile", f"--window-size={width},{height}",
             f"--screenshot={shot}", "--dump-dom", copy.as_uri()],
            capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0 or not shot.exists():
            raise AssertionError(f"chromium exited {proc.returncode}, screenshot "
                                 f"{'written' if shot.exists() else 'missing'}:\n"
                                 f"{proc.stderr[-3000:]}")
        png = read_png(shot)
    parser = _Sections()
    parser.feed(proc.stdout)
    if parser.measured is None:
        raise AssertionError(f"the measuring script did not run:\n{proc.stdout[:2000]}")
    scripts, handlers, _height = parser.measured
    return Rendered(proc.stdout, parser.hosts, scripts, handlers, png)


class _Sections(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hosts: dict[str, Box] = {}
        self.measured: tuple[int, ...] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "section" and "host" in (a.get("class") or "").split():
            x, y, w, h = (int(v) for v in (a.get("data-box") or "0,0,0,0").split(","))
            self.hosts[a.get("id") or ""] = Box(x, y, w, h, int(a.get("data-bars") or 0))
        elif tag == "body" and a.get("data-measured"):
            self.measured = tuple(int(v) for v in (a["data-measured"] or "").split(","))


@dataclass
class Png:
    width: int
    height: int
    channels: int
    pixels: bytes  # rows of width * channels bytes, top to bottom

    def rgb(self, x: int, y: int) -> tuple[int, int, int]:
        i = (y * self.width + x) * self.channels
        return self.pixels[i], self.pixels[i + 1], self.pixels[i + 2]

    def count(self, box: Box, colours: set[tuple[int, int, int]]) -> int:
        """Pixels inside ``box`` (clipped to the image) of one of ``colours``."""
        n = 0
        for y in range(max(box.y, 0), min(box.y + box.h, self.height)):
            for x in range(max(box.x, 0), min(box.x + box.w, self.width)):
                if self.rgb(x, y) in colours:
                    n += 1
        return n


_BYTE = (0xFF).__and__


def _paeth(line: bytearray, prev: bytearray, bpp: int) -> None:
    for i in range(bpp):
        line[i] = (line[i] + prev[i]) & 0xFF
    for i in range(bpp, len(line)):
        a, b, c = line[i - bpp], prev[i], prev[i - bpp]
        if a == b == c:  # flat colour, most of a page: every predictor is the same
            line[i] = (line[i] + a) & 0xFF
            continue
        pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
        line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF


def read_png(path: Path) -> Png:
    """A tiny PNG decoder: 8-bit RGB or RGBA, not interlaced (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    pos, idat, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    assert header is not None, f"{path}: no IHDR"
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"{path}: unsupported {header}"
    bpp = 3 if colour == 2 else 4
    stride = width * bpp
    raw = zlib.decompress(b"".join(idat))
    out = bytearray(height * stride)
    prev = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:  # Sub: a running sum per channel (accumulate and map run in C)
            for c in range(bpp):
                line[c::bpp] = bytes(map(_BYTE, accumulate(line[c::bpp])))
        elif kind == 2:  # Up
            line = bytearray(map(_BYTE, map(add, line, prev)))
        elif kind == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif kind == 4:  # Paeth
            _paeth(line, prev, bpp)
        else:
            assert kind == 0, f"{path}: bad filter {kind} on row {y}"
        out[y * stride:(y + 1) * stride] = line
        prev = line
    return Png(width, height, bpp, bytes(out))


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    value = int(hex_colour.lstrip("#"), 16)
    return value >> 16, (value >> 8) & 0xFF, value & 0xFF


BAR_COLOURS = {_rgb(c) for c in COLOURS.values()}
#: pixels of bar colour a host's row needs: a bar drawn at its minimum width (4px x 14px op
#: bar) has 56
MIN_PIXELS = 40


def timeline_problems(rendered: Rendered, host_ids: Iterable[str]) -> dict[str, str]:
    """For each expected host section id, what is wrong with its timeline on screen: no
    section, no bar in the DOM, outside the screenshot, or no bar-coloured pixels in its
    row. Empty when every host's bars are visibly drawn."""
    problems: dict[str, str] = {}
    png = rendered.png
    for ident in host_ids:
        box = rendered.hosts.get(ident)
        if box is None:
            problems[ident] = "no <section class=host> with this id"
        elif box.bars == 0:
            problems[ident] = "no bar with a box in the DOM"
        elif box.w <= 0 or box.h <= 0 or box.y + box.h > png.height or box.x + box.w > png.width:
            problems[ident] = f"section at {box} is not inside the {png.width}x{png.height} shot"
        else:
            drawn = png.count(box, BAR_COLOURS)
            if drawn < MIN_PIXELS:
                problems[ident] = f"only {drawn} bar-coloured pixel(s) in its row"
    return problems
