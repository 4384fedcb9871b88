"""The run folder: lock, checkpoints, state files, resume and drift, logs and their reader."""
