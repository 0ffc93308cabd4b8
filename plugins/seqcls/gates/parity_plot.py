"""The parity gate's picture (``parity/plot.png``): probabilities against each other, |Δ logit| histogram."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot(path: Path, p_ref: np.ndarray, p_got: np.ndarray, l_ref: np.ndarray, l_got: np.ndarray, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5))
    ax1.scatter(p_ref.ravel(), p_got.ravel(), s=6, alpha=0.5)
    ax1.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    ax1.set_xlabel("Paddle Inference probability")
    ax1.set_ylabel("ONNX Runtime probability")
    ax1.set_title("probabilities per (text, label)")
    d = np.abs(l_ref - l_got).ravel()
    d = np.where(d > 0, d, 1e-12)
    ax2.hist(np.log10(d), bins=40, color="tab:orange")
    ax2.set_xlabel("log10 |Δ logit|  (exact zero shown at -12)")
    ax2.set_ylabel("count")
    ax2.set_title(f"|Δ| distribution, max {float(np.abs(l_ref - l_got).max(initial=0)):.2e}")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
