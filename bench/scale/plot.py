"""The PNG of bench.scale's `active` section: msgs/s and p99 against the number of active
topics, one line per build, the issue's targets dashed."""

import matplotlib

matplotlib.use("Agg")           # no display: write the file only
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

_PLAIN = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")


def active_plot(active, path, *, rate_target, p99_target, title):
    """`active`: {build label: [rows of active.measure]}."""
    fig, (rate_ax, p99_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, rows in active.items():
        rows = [r for r in rows if "msgs_per_s" in r]
        if not rows:
            continue
        ks = [r["topics"] for r in rows]
        rate_ax.plot(ks, [r["msgs_per_s"] for r in rows], marker="o", label=label)
        p99_ax.plot(ks, [r.get("p99_ms") for r in rows], marker="o", label=label)
    rate_ax.axhline(rate_target, color="grey", linestyle="--", linewidth=1,
                    label=f"target {rate_target:,} msgs/s (K = 1,000)")
    p99_ax.axhline(p99_target, color="grey", linestyle="--", linewidth=1,
                   label=f"target p99 < {p99_target:g} ms")
    rate_ax.set(xscale="log", yscale="log", xlabel="active reliable topics (K)",
                ylabel="acknowledged msgs/s (all topics)",
                title="rate, one message in flight per producer")
    p99_ax.set(xscale="log", yscale="log", xlabel="active reliable topics (K)",
               ylabel="ack latency p99 (ms)", title="p99 latency")
    for ax in (rate_ax, p99_ax):
        ax.xaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_major_formatter(_PLAIN)
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=(2, 5)))    # labelled: 2 and 5
        ax.yaxis.set_minor_formatter(_PLAIN)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
