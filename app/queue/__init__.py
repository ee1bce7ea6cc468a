"""The queue engine: lease arithmetic, state transitions and their SQL."""
