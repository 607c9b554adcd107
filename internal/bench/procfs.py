"""Tiny readers of ``/proc/<pid>`` used by the benchmarks (Linux only)."""

from __future__ import annotations

import os

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float:
    """User + system CPU time consumed so far by ``pid`` (0.0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            text = fh.read()
    except OSError:
        return 0.0
    # the command name may contain spaces and parentheses: split after the last ')'
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def status_kib(pid: int, *keys: str) -> dict[str, int]:
    """Selected ``/proc/<pid>/status`` fields in KiB, e.g. ``VmRSS`` and ``VmHWM``."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                name, _, value = line.partition(":")
                if name in keys:
                    out[name] = int(value.split()[0])
    except OSError:
        pass
    return out


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown"


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot (``/proc/stat``, first line)."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / _CLK_TCK
