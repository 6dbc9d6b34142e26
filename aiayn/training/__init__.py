"""Training: schedules, optimizers, resumable checkpoints, the loop."""
