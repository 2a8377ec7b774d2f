"""``TrainingError``: training cannot go on. Raised by the loop (non-finite losses or weights, a metric that cannot
be computed), the resume and init checks (training/resume.py), the process set-up (training/distributed.py) and
the loggers asked for without their package (training/tblog.py, wblog.py); `captioner train` prints its message
and exits 1."""


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. non-finite losses in a row); the message says why and what to try."""
