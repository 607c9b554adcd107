"""Composition: the bridge object graph and its method tables (above core, below transport)."""
