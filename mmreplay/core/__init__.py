"""The parts a store wires together, below ``ReplayStore``: the index and its row arithmetic (layer 2),
the chunk log, state files, snapshots and the rate limiter (3), the episode writer (4), draws and
durability (5). ARCHITECTURE.md's table gives each module's layer."""
