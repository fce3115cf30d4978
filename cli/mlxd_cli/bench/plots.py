"""The PNG plots of mlx-bench, from the results dict ``report.build_results`` makes (or a saved results.json).

Contract: ``write_plots(results, out_dir)`` writes throughput.png (aggregate tok/s vs concurrency per target,
one panel per prompt style, min-max error bars), speedup.png (each target vs the baseline; only with two
targets or more) and, with chat sessions, ttft_per_turn.png (TTFT p50 per turn, one panel per concurrency
level). matplotlib is imported inside it, with the Agg backend, so the tool starts without it.
"""

from __future__ import annotations

from pathlib import Path


def write_plots(results: dict, out_dir: Path) -> list[Path]:
    """throughput.png and (with two targets or more) speedup.png.

    Args:
        results: ``build_results`` output.
        out_dir: Destination directory.

    Returns:
        The files written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    styles = list(dict.fromkeys(cell["style"] for cell in results["summary"]))
    names = [target["name"] for target in results["targets"]]
    figure, axes = plt.subplots(1, max(len(styles), 1), figsize=(5.5 * max(len(styles), 1), 4), squeeze=False)
    for axis, style in zip(axes[0], styles):
        for name in names:
            cells = [
                cell
                for cell in results["summary"]
                if cell["style"] == style and cell["target"] == name and cell["aggregate_tok_s"]
            ]
            if not cells:
                continue
            x = [cell["concurrency"] for cell in cells]
            y = [cell["aggregate_tok_s"]["median"] for cell in cells]
            errors = [
                [m - cell["aggregate_tok_s"]["min"] for m, cell in zip(y, cells)],
                [cell["aggregate_tok_s"]["max"] - m for m, cell in zip(y, cells)],
            ]
            axis.errorbar(x, y, yerr=errors, marker="o", capsize=3, label=name)
        axis.set_title(f"{style} prompts")
        axis.set_xlabel("concurrency")
        axis.set_ylabel("aggregate output tok/s")
        axis.set_xticks(sorted({cell["concurrency"] for cell in results["summary"]}))
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle("Throughput: median, min-max over rounds")
    figure.tight_layout()
    path = out_dir / "throughput.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    written.append(path)

    ratios = [row for row in results["ratios"] if row["ratio"]]
    if ratios:
        groups = list(dict.fromkeys((row["style"], row["concurrency"]) for row in ratios))
        others = list(dict.fromkeys(row["target"] for row in ratios))
        width = 0.8 / len(others)
        figure, axis = plt.subplots(figsize=(max(6.0, 1.2 * len(groups) * len(others)), 4))
        for offset, name in enumerate(others):
            rows = {(row["style"], row["concurrency"]): row["ratio"] for row in ratios if row["target"] == name}
            positions, heights, low, high = [], [], [], []
            for index, group in enumerate(groups):
                if group in rows:
                    ratio = rows[group]
                    positions.append(index + (offset - (len(others) - 1) / 2) * width)
                    heights.append(ratio["median"])
                    low.append(ratio["median"] - ratio["min"])
                    high.append(ratio["max"] - ratio["median"])
            axis.bar(positions, heights, width, yerr=[low, high], capsize=3, label=name)
        axis.axhline(1.0, color="black", linewidth=0.8)
        axis.set_xticks(range(len(groups)), [f"{style} c={c}" for style, c in groups])
        axis.set_ylabel(f"aggregate tok/s / {results['baseline']}")
        axis.set_title(f"Speedup vs {results['baseline']}: median, min-max over rounds")
        axis.legend()
        figure.tight_layout()
        path = out_dir / "speedup.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)

    chat_cells = [cell for cell in results["summary"] if cell.get("turns")]
    if chat_cells:
        levels = list(dict.fromkeys(cell["concurrency"] for cell in chat_cells))
        figure, axes = plt.subplots(1, len(levels), figsize=(5.5 * len(levels), 4), squeeze=False)
        for axis, level in zip(axes[0], levels):
            for cell in (cell for cell in chat_cells if cell["concurrency"] == level):
                entries = [entry for entry in cell["turns"] if entry["ttft_p50_s"]]
                y = [entry["ttft_p50_s"]["median"] * 1000 for entry in entries]
                errors = [
                    [m - entry["ttft_p50_s"]["min"] * 1000 for m, entry in zip(y, entries)],
                    [entry["ttft_p50_s"]["max"] * 1000 - m for m, entry in zip(y, entries)],
                ]
                axis.errorbar(
                    [entry["turn"] for entry in entries], y, yerr=errors, marker="o", capsize=3, label=cell["target"]
                )
            axis.set_title(f"chat sessions, c={level}")
            axis.set_xlabel("turn")
            axis.set_ylabel("TTFT p50 (ms)")
            axis.set_xticks(sorted({entry["turn"] for cell in chat_cells for entry in cell["turns"]}))
            axis.set_ylim(bottom=0)
            axis.grid(alpha=0.3)
            axis.legend()
        figure.suptitle("Time to first token per turn: median, min-max over rounds")
        figure.tight_layout()
        path = out_dir / "ttft_per_turn.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
