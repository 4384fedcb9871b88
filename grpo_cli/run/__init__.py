"""The run folder: lock, checkpoints, state files, resume, rewind and drift, logs and their reader, the metrics table,
replay records, trackers' folders (what the trainer's process is, whatever folder it writes: grpo_cli/process/)."""
