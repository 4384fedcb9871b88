"""Multi-turn episodes: environments and tools."""
