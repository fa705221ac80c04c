"""Charts as inline SVG, drawn with matplotlib and byte-for-byte deterministic.

No pyplot (no global figure state, no GUI backend). Each chart's ids are salted with its own
name, so several SVGs in one page never share an id; the date stamp is dropped, text stays text
(``svg.fonttype = none``) and nothing is rasterised, so the SVG holds no embedded image (the
page's Content-Security-Policy allows none). Labels passed in are plain: ``plain()`` removes
what matplotlib would parse as mathtext.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib

matplotlib.use("svg", force=False)  # a headless backend, whatever the environment says
from matplotlib.figure import Figure  # noqa: E402  (after choosing the backend)

_RC = {"svg.fonttype": "none", "font.size": 9, "axes.titlesize": 10, "svg.image_inline": True,
       "path.simplify": False}
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:+/=,() -]")


def plain(label: object, limit: int = 40) -> str:
    """A chart label: no mathtext ($, \\), no control characters, short."""
    return _UNSAFE.sub("?", str(label))[:limit]


def _svg(fig: Figure, salt: str) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({**_RC, "svg.hashsalt": f"fastpath-{salt}"}):
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "fastpath (matplotlib)"},
                    bbox_inches="tight")
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG goes inline
    return _METADATA.sub("", text, count=1)


def speedup_heatmap(batches: list[int], contexts: list[int], speedup: dict[tuple[int, int], float],
                    passed: dict[tuple[int, int], bool], threshold: float, title: str, salt: str) -> str:
    """Speedup over batch (rows) x context (columns); a cell's text is its speedup, a cell that
    did not pass is hatched. Colours diverge at ``threshold``."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(1.2 + 0.9 * len(contexts), 0.9 + 0.42 * len(batches)))
        ax = fig.add_subplot()
        grid = [[speedup.get((b, c), math.nan) for c in contexts] for b in batches]
        finite = [v for row in grid for v in row if not math.isnan(v)]
        spread = max([abs(v - threshold) for v in finite] + [0.05])
        norm = matplotlib.colors.TwoSlopeNorm(vcenter=threshold, vmin=threshold - spread, vmax=threshold + spread)
        mesh = ax.pcolormesh(grid, cmap="RdYlGn", norm=norm, edgecolors="white", linewidth=1.5)
        for i, b in enumerate(batches):
            for j, c in enumerate(contexts):
                v = grid[i][j]
                ax.text(j + 0.5, i + 0.5, "—" if math.isnan(v) else f"{v:.2f}×", ha="center", va="center",
                        fontsize=8, parse_math=False)
                if (b, c) in passed and not passed[(b, c)]:
                    ax.add_patch(matplotlib.patches.Rectangle((j, i), 1, 1, fill=False, hatch="///",
                                                              edgecolor="#7a0000", linewidth=0))
        ax.set_xticks([j + 0.5 for j in range(len(contexts))], [str(c) for c in contexts])
        ax.set_yticks([i + 0.5 for i in range(len(batches))], [str(b) for b in batches])
        ax.set_xlabel("context length")
        ax.set_ylabel("batch")
        ax.set_title(plain(title, 80), loc="left")
        bar = fig.colorbar(mesh, ax=ax, label="speedup (fast / standard)", shrink=0.9)
        bar.solids.set_rasterized(False)  # matplotlib rasterises long colour bars into a PNG
        return _svg(fig, salt)


def roofline(points: list[dict], bandwidth_gbps: float | None, salt: str) -> str:
    """Measured step time over bytes each step must move (log-log), one marker per path; the
    line is the minimum step time at the HBM bandwidth measured in the run, so a point's height
    above it is 1/MBU. ``points``: {"path", "bytes", "step_ms", "batch"}."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6.4, 3.8))
        ax = fig.add_subplot()
        markers = ["o", "s", "^", "D", "v", "P"]
        paths = sorted({p["path"] for p in points})
        for k, path in enumerate(paths):
            mine = [p for p in points if p["path"] == path]
            ax.scatter([p["bytes"] for p in mine], [p["step_ms"] for p in mine], marker=markers[k % len(markers)],
                       label=plain(path), s=22, zorder=3)
        xs = [p["bytes"] for p in points]
        if bandwidth_gbps and xs:
            lo, hi = min(xs) / 1.5, max(xs) * 1.5
            ax.plot([lo, hi], [lo / (bandwidth_gbps * 1e6), hi / (bandwidth_gbps * 1e6)], color="black",
                    linewidth=1, label=f"bound at {bandwidth_gbps:,.0f} GB/s (MBU 100 %)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("bytes each step must move")
        ax.set_ylabel("step time (ms)")
        ax.set_title("roofline: step time vs bytes moved", loc="left")
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=8)
        return _svg(fig, salt)


def error_vs_tolerance(kernels: list[str], ratios: list[list[float]], salt: str) -> str:
    """Each kernel's errors as a fraction of their tolerance (log x); 1 is the limit."""
    with matplotlib.rc_context(_RC):
        fig = Figure(figsize=(6.4, 0.8 + 0.28 * len(kernels)))
        ax = fig.add_subplot()
        for i, values in enumerate(ratios):
            shown = [max(v, 1e-6) for v in values]
            ax.scatter(shown, [i] * len(shown), s=12, alpha=0.7,
                       color=["#b00020" if v > 1 else "#1f6f43" for v in values], zorder=3)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log")
        ax.set_yticks(range(len(kernels)), [plain(k) for k in kernels])
        ax.set_ylim(-0.6, len(kernels) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel("error / tolerance (right of the line fails)")
        ax.grid(True, axis="x", which="both", linewidth=0.3)
        return _svg(fig, salt)
