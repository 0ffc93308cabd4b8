"""The quality gate's picture (``quality/labels.png``): F1 per label, candidate beside champion, support as text."""

from __future__ import annotations

from pathlib import Path

from seqcls.gates.metrics import Scores


def plot_labels(path: Path, candidate: Scores, champion: Scores | None, *, title: str) -> Path:
    """Horizontal bars per label (the labels of the eval set, in label order); a label a model lacks shows no bar."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import font_manager

    cjk = [f.name for f in font_manager.fontManager.ttflist if any(k in f.name for k in ("CJK", "WenQuanYi", "Hei"))]
    if cjk:  # label names are often Chinese: a CJK font when the host has one, else boxes (still readable by row)
        plt.rcParams["font.sans-serif"] = [cjk[0], *plt.rcParams["font.sans-serif"]]
    labels = [lbl for lbl, row in candidate.per_label.items() if row.get("support", 0) or row.get("predicted", 0)]
    height = max(3.0, 0.28 * len(labels) + 1.2)
    fig, ax = plt.subplots(figsize=(9, height))
    ys = range(len(labels))
    cand = [candidate.per_label[lbl]["f1"] for lbl in labels]
    if champion is not None:
        champ = [champion.per_label.get(lbl, {}).get("f1", 0.0) for lbl in labels]
        ax.barh(
            [y + 0.2 for y in ys],
            champ,
            height=0.4,
            color="tab:grey",
            label=f"champion (micro-F1 {champion.micro_f1:.3f})",
        )
    ax.barh(
        [y - 0.2 for y in ys],
        cand,
        height=0.4,
        color="tab:blue",
        label=f"candidate (micro-F1 {candidate.micro_f1:.3f})",
    )
    ax.set_yticks(list(ys), [f"{lbl}  (n={int(candidate.per_label[lbl]['support'])})" for lbl in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.0)
    ax.set_xlabel("F1")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=9)
    with warnings.catch_warnings():  # without a CJK font each missing glyph warns: the bars still say it all
        warnings.simplefilter("ignore", UserWarning)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
