"""The trainer's process, whatever folder it writes: CPU threads and OpenMP's wait policy (cpus.py), freed host memory
kept for reuse (allocator.py), the hub reached or worked offline (hub.py), peak memory by phase (memory.py), and the
stall watchdog that tells a slow phase from a stopped one (watchdog.py)."""
