"""Training: the loop and what only it needs.

    loop.py          train(): set-up or resume, epochs, validation, checkpoints
    objectives/      what a training step minimises, one module per objective (train.objective.kind)
    losses.py        the losses the objectives combine; rewards.py, CIDEr-D on token ids (SCST's reward)
    inputs.py        records, the feature cache, datasets and each epoch's loader
    validation.py    the per-epoch validation: greedy captions scored, the teacher-forced loss
    resume.py        --resume and --init: what a path holds, the checks, the saved state
    run_files.py     what a run writes into its folder, and in which order; progress.py, where a run stands
    optim.py         the optimizers; distributed.py, device, DDP and RNG state
    run_logs.py      the logs besides metrics.jsonl: tblog.py (TensorBoard), wblog.py (Weights & Biases)
    errors.py        TrainingError
"""
