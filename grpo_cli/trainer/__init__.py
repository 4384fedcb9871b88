"""Training: the engine (the loop), set-up, optimizer, processes, launch, step metrics."""
