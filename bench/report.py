"""Presents the scoring benchmark's results: rich tables on stdout, docs/performance.md and
docs/performance.png (speed-up vs scikit-learn against batch size, one panel per pipeline).

Everything is rendered from the JSON ``bench/scoring.py --out`` writes, so a page can be rebuilt
from a results file: ``python bench/report.py results.json [--md docs/performance.md]``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KESTREL_NOTE = "Kestrel: `compiler.compile(estimator)` with default options except the backend"
LEFT = frozenset({"pipeline", "target", "unit"})  # text columns; the others are numbers
NOT_TIMED = {"unsup": "unsup", "err": "err", "not installed": "not installed"}


@dataclass
class Footnotes:
    """Numbered reasons, each text once."""

    texts: list[str] = field(default_factory=list)

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def lines(self) -> list[str]:
        return [f"[{i}] {t}" for i, t in enumerate(self.texts, 1)]


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


# -- number formats ------------------------------------------------------------------------------
def fmt_ms(ms: float) -> str:
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def fmt_x(x: float) -> str:
    """A ratio with two significant digits: 728×, 72×, 5.5×, 0.58×, 0.013×."""
    return f"{x:.0f}×" if x >= 100 else f"{float(f'{x:.2g}'):g}×"


# -- tables --------------------------------------------------------------------------------------
def _cells(results: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(c["pipeline"], c["batch"], c["system"]): c for c in results["cells"]}


def _label(results: dict[str, Any], key: str) -> str:
    return results["pipelines"][key]["label"]


def _systems(results: dict[str, Any]) -> list[str]:
    return list(results["config"]["systems"])


def _kestrel(results: dict[str, Any]) -> list[str]:
    return [s for s in _systems(results) if results["systems"][s]["family"] == "kestrel"]


def cell_text(cell: dict[str, Any], notes: Footnotes) -> str:
    """``ms (×sklearn)``, with ``!`` and a footnote for wrong output, or why there is no time."""
    status = cell["status"]
    if status in ("ok", "!"):
        text = fmt_ms(cell["ms"])
        if cell["speedup_sklearn"] is not None and cell["system"] != "sklearn":
            text += f" ({fmt_x(cell['speedup_sklearn'])})"
        return text + (f" ! {notes.ref(cell['reason'])}" if status == "!" else "")
    if status == "skip":
        return f"skip (>budget) {notes.ref(cell['reason'])}"
    return f"{NOT_TIMED.get(status, status)} {notes.ref(cell['reason'])}".strip()


def latency_table(results: dict[str, Any]) -> Table:
    systems, kestrel = _systems(results), _kestrel(results)
    notes = Footnotes()
    headers = ["pipeline", "batch", *systems, *(f"{k} vs best other" for k in kestrel)]
    cells = _cells(results)
    rows = []
    for key in results["config"]["pipelines"]:
        for batch in results["config"]["batches"]:
            row = [_label(results, key), str(batch)]
            row += [cell_text(cells[key, batch, s], notes) for s in systems]
            for k in kestrel:
                c = cells[key, batch, k]
                ratio = c["speedup_best_other"]
                row.append(f"{fmt_x(ratio)} vs {c['best_other']}" if ratio is not None else "—")
            rows.append(row)
    threads = results["config"]["threads"]
    title = (
        f"Median ms per predict_proba call (speed-up vs scikit-learn), {threads} thread(s), "
        f"{results['config']['rounds']} interleaved rounds"
    )
    return Table(title, headers, rows, notes.lines())


def targets_table(results: dict[str, Any]) -> Table:
    kestrel = _kestrel(results)
    grouped: dict[tuple[str, int, str], dict[str, dict[str, Any]]] = {}
    for t in results["targets"]:
        grouped.setdefault((t["pipeline"], t["batch"], t["target"]), {})[t["system"]] = t
    notes = Footnotes()
    rows = []
    for (key, batch, target), by_system in grouped.items():
        row = [_label(results, key), str(batch), target]
        for k in kestrel:
            t = by_system.get(k)
            row.append(_target_text(t, notes) if t is not None else "—")
        rows.append(row)
    applies = results["config"]["threads"] == 1
    title = "Issue 6 targets (Kestrel; value, and ×faster needed where it fails)"
    if not applies:
        title += " — the targets are for 1 thread: shown for information only"
    return Table(title, ["pipeline", "batch", "target", *kestrel], rows, notes.lines())


def _target_text(t: dict[str, Any], notes: Footnotes) -> str:
    if t["value"] is None:
        return f"{t['result']} {notes.ref(t['note'])}"
    value = fmt_x(t["value"]) if t["target"].endswith("system") else _plain(t)
    text = f"{t['result']} ({value})"
    if t["result"] == "fail" and t["shortfall"]:
        text += f", needs {fmt_x(t['shortfall'])}"
    if t["note"]:
        text += f" {notes.ref(t['note'])}"
    return text


def _plain(t: dict[str, Any]) -> str:
    if "limit" in t["target"]:
        return f"{t['value']:.0%} of limit"
    return f"{fmt_x(t['value'])} ORT's"


def efficiency_table(results: dict[str, Any]) -> Table | None:
    """Achieved GB/s (linear) or GFLOP/s (MLP) per system and batch, and the share of the limit."""
    systems = _systems(results)
    by_key = _cells(results)
    rows = []
    for key in results["config"]["pipelines"]:
        for batch in results["config"]["batches"]:
            here = [by_key[key, batch, s] for s in systems]
            # Small batches measure per-call overhead, not throughput.
            if batch < 10_000 or not any(c["achieved"] is not None for c in here):
                continue
            unit = next(c["achieved_unit"] for c in here if c["achieved_unit"])
            row = [_label(results, key), str(batch), unit]
            row += [
                f"{c['achieved']:.3g} ({c['limit_fraction']:.0%})"
                if c["achieved"] is not None
                else "—"
                for c in here
            ]
            rows.append(row)
    if not rows:
        return None
    limits = results["limits"]
    title = (
        f"How close to the machine: achieved rate (share of the limit: read "
        f"{limits['read_gbs']:.1f} GB/s, GEMM {limits['gemm_gflops']:.0f} GFLOP/s)"
    )
    notes = [
        "linear (a): bytes = rows × (50 float32 features in + class probabilities out); "
        "MLP (i): FLOPs = rows × Σ 2·fan_in·fan_out of its layers"
    ]
    return Table(title, ["pipeline", "batch", "unit", *systems], rows, notes)


def convert_table(results: dict[str, Any]) -> Table:
    """Per pipeline and system: convert/compile seconds, worst max |Δp| and argmax agreement."""
    systems = _systems(results)
    notes = Footnotes()
    rows = []
    for key in results["config"]["pipelines"]:
        p = results["pipelines"][key]
        fit = f"{p['fit_s']:.1f}" if p.get("fit_s") is not None else "—"
        row = [p["label"], fit]
        for s in systems:
            conv = p["systems"].get(s)
            if conv is None:  # the pipeline itself could not run
                row.append(f"not installed {notes.ref(p['reason'])}")
                continue
            if conv["status"] != "ok":
                row.append(cell_text({"status": conv["status"], "reason": conv["reason"]}, notes))
                continue
            mine = [c for c in results["cells"] if c["pipeline"] == key and c["system"] == s]
            diffs = [c["max_abs_diff"] for c in mine if c["max_abs_diff"] is not None]
            agree = [c["argmax_agreement"] for c in mine if c["argmax_agreement"] is not None]
            text = f"{conv['convert_s']:.2f} s" if s != "sklearn" else "—"
            if s != "sklearn":
                text += f" · {max(diffs):.1e}" if diffs else " · —"
                text += f" · {_percent(min(agree))}" if agree else ""
            row.append(text)
        rows.append(row)
    title = "Convert/compile seconds · worst max |Δp| vs scikit-learn · worst argmax agreement"
    return Table(title, ["pipeline", "fit s", *systems], rows, notes.lines())


def _percent(share: float) -> str:
    return "100%" if share == 1.0 else f"{share:.2%}"


def tables(results: dict[str, Any]) -> list[Table]:
    found = [latency_table(results), targets_table(results), efficiency_table(results)]
    return [t for t in (*found, convert_table(results)) if t is not None]


def limits_line(results: dict[str, Any]) -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from scoring_limits import describe

    runs = len(results.get("limit_runs", [])) or 1
    how = f", best of {runs} measurements (start and end of the run)" if runs > 1 else ""
    return f"Machine limits, {results['config']['threads']} thread(s){how}: " + describe(
        results["limits"]
    )


# -- rich ----------------------------------------------------------------------------------------
def print_tables(results: dict[str, Any]) -> None:
    """The tables on stdout (rich), then the machine's limits and the run's notes."""
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console(width=220)
    for table in tables(results):
        rich = RichTable(title=table.title, title_justify="left")
        for header in table.headers:
            rich.add_column(header, justify="left" if header in LEFT else "right", overflow="fold")
        for row in table.rows:
            rich.add_row(*row)
        console.print(rich)
        for note in table.notes:
            console.print(note, markup=False, highlight=False)
    console.print(limits_line(results), markup=False, highlight=False)
    for note in results.get("notes", []):
        console.print(f"note: {note}", markup=False, highlight=False)


# -- Markdown and PNG ----------------------------------------------------------------------------
def _md_table(table: Table) -> list[str]:
    numeric = [h not in LEFT for h in table.headers]
    lines = [
        f"**{table.title}**",
        "",
        "| " + " | ".join(table.headers) + " |",
        "|" + "|".join("---:" if n else "---" for n in numeric) + "|",
    ]
    lines += ["| " + " | ".join(_md_escape(c) for c in row) + " |" for row in table.rows]
    if table.notes:
        lines += ["", *("- " + _md_escape(n) for n in table.notes)]
    return [*lines, ""]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(results: dict[str, Any], png_name: str | None) -> str:
    env, config = results["env"], results["config"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    commit = (env["commit"] or "unknown")[:12] + (" (uncommitted changes)" if env["dirty"] else "")
    args = " ".join(config.get("argv", []))
    lines = [
        "# Scoring performance: Kestrel vs scikit-learn, ONNX Runtime and Hummingbird",
        "",
        "<!-- Generated by bench/scoring.py --report (bench/report.py); do not edit by hand. -->",
        "",
        f"Measured {env['date']} at commit `{commit}` on {env['cpu']} ({env['cpus']} CPUs), "
        f"{config['threads']} thread(s) for every system, Python {env['python']}.",
        f"Versions: {versions}.",
        "",
        "Every system scores the same host rows (a float32 matrix; `f`: a DataFrame) with "
        "`predict_proba` and returns a host numpy array; conversion happens once, before timing. "
        f"Cells are medians of {config['rounds']} interleaved rounds of at least "
        f"{config['min_time']:g} s of calls each. The machine is shared with other jobs: treat "
        "a single cell as ±30 % and compare ratios within a row. "
        f"{KESTREL_NOTE} (max_batch {config['max_batch']}: larger calls run in chunks of up to max_batch rows, or more for graphs with cheap or compute-bound rows, up to 16 384). "
        "`!` = output disagrees with scikit-learn (timed anyway), `unsup` = the system cannot "
        "convert the pipeline, `err` = it raised, `skip (>budget)` = one system's rounds in "
        f"one cell would exceed {config['cell_budget']:g} s.",
        "",
    ]
    for table in tables(results):
        lines += _md_table(table)
    lines += [f"{limits_line(results)}.", ""]
    for note in results.get("notes", []):
        lines += [f"Note: {note}.", ""]
    if png_name:
        lines += [f"![speed-up vs scikit-learn by batch size]({png_name})", ""]
    lines += [
        "## Reproduce",
        "",
        "```sh",
        "make bench   # installs .[bench], runs the full benchmark, rewrites this page",
        f".venv/bin/python bench/scoring.py {args}".rstrip(),
        "```",
        "",
        "Without ONNX Runtime, Hummingbird or torch installed their columns read `not installed` "
        "and the run goes on. `python bench/report.py results.json` rebuilds this page from a "
        "results file.",
        "",
    ]
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> bool:
    """Speed-up vs scikit-learn against batch size, log-log, one panel per pipeline; False if
    matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    keys = list(results["config"]["pipelines"])
    systems = [s for s in _systems(results) if s != "sklearn"]
    cols = min(5, len(keys))
    rows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.8 * rows), squeeze=False)
    cells = _cells(results)
    for ax, key in zip(axes.flat, keys, strict=False):
        for s in systems:
            points = [
                (b, c["speedup_sklearn"], c["status"])
                for b in results["config"]["batches"]
                if (c := cells[key, b, s])["speedup_sklearn"] is not None
            ]
            if points:
                xs, ys, st = zip(*points, strict=True)
                (line,) = ax.plot(xs, ys, marker="o", label=s, linewidth=1.2, markersize=3)
                wrong = [(x, y) for x, y, t in zip(xs, ys, st, strict=True) if t == "!"]
                if wrong:
                    ax.plot(*zip(*wrong, strict=True), "x", color=line.get_color(), markersize=8)
            else:
                ax.plot([], [], marker="o", label=s)  # keep colours aligned across panels
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(_label(results, key), fontsize=9)
        ax.tick_params(labelsize=7, which="both")
        ax.yaxis.set_major_formatter(FuncFormatter(_ratio_tick))
        ax.yaxis.set_minor_formatter(FuncFormatter(_ratio_tick))
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(systems), fontsize=8, frameon=False)
    fig.supxlabel("rows per call (× marks: wrong output)", fontsize=9)
    fig.supylabel("speed-up vs scikit-learn", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / (2.8 * rows)))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _ratio_tick(value: float, _position: int) -> str:
    """Log-axis labels at 1, 2 and 5 times powers of ten only (minor ticks would crowd)."""
    if value <= 0:
        return ""
    mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}×" if round(mantissa, 6) in (1.0, 2.0, 5.0) else ""


def write(results: dict[str, Any], md_path: Path, png_path: Path) -> list[Path]:
    """Write the page (and the plot, if matplotlib is installed); the paths written."""
    md_path.parent.mkdir(parents=True, exist_ok=True)
    has_png = plot(results, png_path)
    md_path.write_text(markdown(results, png_path.name if has_png else None))
    return [md_path, png_path] if has_png else [md_path]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Rebuild docs/performance.md from results JSON")
    parser.add_argument("results", help="the JSON written by bench/scoring.py --out")
    default = Path(__file__).resolve().parents[1] / "docs" / "performance.md"
    parser.add_argument("--md", default=str(default), help="the page (a .png is written beside)")
    args = parser.parse_args(argv)
    try:
        results = json.loads(Path(args.results).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        parser.error(f"cannot read results {args.results!r}: {exc}")
    md = Path(args.md)
    for path in write(results, md, md.with_suffix(".png")):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
