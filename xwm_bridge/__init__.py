"""xwm-bridge: a wire-compatible, hardened re-implementation of xworkmate-bridge."""

__version__ = "0.1.0"
