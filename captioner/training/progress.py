"""Where a training run stands (``Progress``): what its checkpoints record besides weights and optimizer state, and
when it stops (early stopping by ``train.patience``, ``train.time_budget_s``).

The reason a run stopped is saved with its last epoch, so that a run killed after its last checkpoint but before its
end (writing the average) and resumed stops there too, rather than training an epoch more than it would have.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Progress:
    """Where a run stands: what the checkpoint records besides weights and optimizer state."""

    epoch: int = 0  # epochs completed
    step: int = 0  # batches processed (skipped ones included)
    history: list[dict] = field(default_factory=list)  # one metrics entry per epoch
    best: dict = field(default_factory=dict)  # {"metric", "value", "epoch"}
    bad_epochs: int = 0  # epochs since the validation metric last improved (early stopping)
    elapsed_s: float = 0.0  # wall time of the run so far, across resumes (train.time_budget_s counts it)
    run_id: str | None = None  # which run (run_files.new_run_id), kept across resumes; None: an earlier version's
    stop: str | None = None  # why the run stopped after this epoch ("patience", "time budget"); None: it did not
    nonfinite_run: int = 0  # consecutive skipped steps (not saved: a checkpoint follows a good step)
    # a checkpoint saved inside an epoch (train.save_every_min, a preemption signal): that epoch (0-based), the
    # batches of it done, its running sums and the size of the training set it shuffled ({"epoch", "batches", "sums",
    # "n_steps", "skipped", "train_time", "items", "train_items"}: resume.check_resumed_inside_epoch); None at an
    # epoch's end
    in_epoch: dict | None = None

    def payload(self) -> dict:
        return {"epoch": self.epoch, "step": self.step, "elapsed_s": self.elapsed_s,
                "run_id": self.run_id, "stop": self.stop, "in_epoch": self.in_epoch,
                "metrics": {"history": self.history, "best": self.best, "bad_epochs": self.bad_epochs}}

    @classmethod
    def from_payload(cls, payload: dict) -> "Progress":
        metrics = payload["metrics"]  # .get below: what the checkpoints of earlier versions lack
        return cls(epoch=int(payload["epoch"]), step=int(payload["step"]),
                   history=list(metrics["history"]), best=dict(metrics["best"]), bad_epochs=int(metrics["bad_epochs"]),
                   elapsed_s=float(payload.get("elapsed_s", 0.0)), run_id=payload.get("run_id"),
                   stop=payload.get("stop"), in_epoch=payload.get("in_epoch"))

    def decide_stop(self, patience: int, budget_s: float, elapsed_s: float, last_epoch_s: float) -> bool:
        """After an epoch: whether to stop here (``stop`` records why), by patience or the time budget."""
        self.stop = None
        if self.bad_epochs >= patience:
            self.stop = "patience"
        elif out_of_time(budget_s, elapsed_s, last_epoch_s):
            self.stop = "time budget"
        return self.stop is not None

    def stopped_already(self, patience: int, budget_s: float, stopped_budget_s: float) -> bool:
        """On resume: whether the run had stopped after its last epoch and would stop there again with these
        settings (``stopped_budget_s``: the time budget it stopped under). A raised ``train.patience`` or time
        budget trains on if another epoch fits; an unchanged one stops, as the run did."""
        if self.stop == "patience":
            return self.bad_epochs >= patience
        if self.stop == "time budget":
            return 0 < budget_s <= stopped_budget_s or bool(self.history) and out_of_time(
                budget_s, self.elapsed_s, self.history[-1]["time_s"])
        return False


def out_of_time(budget_s: float, elapsed_s: float, last_epoch_s: float) -> bool:
    """Stop when another epoch like the last one (training + validation) would end past the budget:
    a run given an hour then takes at most about an hour, rather than overshooting by an epoch."""
    return budget_s > 0 and elapsed_s + last_epoch_s > budget_s
