"""Multi-agent turns: a bounded planner → workers → reviewer loop (forwarding.md §6)."""
