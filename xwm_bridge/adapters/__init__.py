"""Front ends that expose something else as a bridge-protocol service."""
