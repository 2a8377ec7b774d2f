"""The logs a training run writes besides metrics.jsonl, opened together: TensorBoard (``train.tensorboard``,
captioner/training/tblog.py) and Weights & Biases (``train.wandb``, captioner/training/wblog.py), behind the verbs
the training loop calls (``RunLogs``: step, epoch, images, close). Both get the same records under the same
names; each epoch's validation overlays are drawn once, here, for all of them.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from captioner.training.tblog import open_tensorboard
from captioner.training.wblog import open_wandb

log = logging.getLogger(__name__)


def validation_overlays(model: Any, records: Sequence[Any]) -> list[tuple[str, np.ndarray, str]]:
    """(name, pixels (H, W, 3) uint8, caption) per readable record: its greedy caption above its per-word
    attention overlays, rendered once for every log."""
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from captioner.data.images import ImageLoadError, load_image
    from captioner.visualize import overlay_attention

    overlays = []
    for record in records:
        try:
            image = load_image(record.path)
        except ImageLoadError as err:
            log.warning("skipping validation image %s in the logs (%s)", record.path, err)
            continue
        out = model.caption([image], beam=1)[0]
        fig = overlay_attention(image, out["words"], out["alphas"], out["grid_hw"])
        fig.suptitle(out["caption"] or "(empty caption)")
        canvas = FigureCanvasAgg(fig)
        canvas.draw()
        pixels = np.asarray(canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)
        plt.close(fig)
        overlays.append((Path(record.path).stem, pixels, out["caption"]))
    return overlays


class RunLogs:
    """Every log a training run writes besides metrics.jsonl (TensorBoard, W&B), behind the verbs the training
    loop (training/loop.py) calls; the validation overlays are drawn once for all of them."""

    def __init__(self, logs: Sequence[Any]) -> None:
        self.logs = list(logs)

    def step(self, parts: dict[str, Any], lr: float, step: int) -> None:
        for sink in self.logs:
            sink.step(parts, lr, step)

    def epoch(self, entry: dict[str, Any], epoch: int) -> None:
        for sink in self.logs:
            sink.epoch(entry, epoch)

    def images(self, model: Any, records: Sequence[Any], epoch: int) -> None:
        overlays = validation_overlays(model, records)
        for sink in self.logs:
            sink.overlays(overlays, epoch)

    def close(self) -> None:
        for sink in self.logs:
            sink.close()


def open_run_logs(run_dir: Path, tensorboard: str, wandb: str, config: dict, resumed: bool = False
                  ) -> RunLogs | None:
    """The run's logs per ``train.tensorboard`` (captioner/training/tblog.py) and ``train.wandb``
    (captioner/training/wblog.py); None when neither logs."""
    logs = [sink for sink in (open_tensorboard(run_dir, tensorboard), open_wandb(run_dir, wandb, config, resumed))
            if sink is not None]
    return RunLogs(logs) if logs else None


def epoch_summary(entry: dict, metric: str, improved: bool) -> str:
    """The line printed after each epoch: training and validation figures, timings, whether it was the best."""
    def fmt(key: str) -> str:
        value = entry.get(key)
        return "-" if value is None else f"{value:.2f}"

    return (f"epoch {entry['epoch']}: loss {fmt('train_loss')}  val loss {fmt('val_loss')}  "
            f"BLEU-4 {fmt('BLEU-4')}  CIDEr-D {fmt('CIDEr-D')}  max alpha {fmt('alpha_max')}  "
            f"entropy {fmt('alpha_entropy')}  cells {fmt('cells_per_caption')}  moves {fmt('cell_changes')}  "
            + (f"mirror {fmt('mirror_follow')}  columns mirror {fmt('columns_mirror')} stay {fmt('columns_stay')}  "
               if "mirror_words" in entry else "")
            + (f"pointing {fmt('pointing')} (centre {fmt('centre_pointing')}) inside {fmt('inside')}  "
               if "pointing" in entry else "")
            + f"({entry['time_s']:.0f}s)"
            + (f"  best {metric}" if improved else ""))
