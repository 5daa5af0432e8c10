"""Tracking: metrics sink, sample tables, progress with ETA, health checks, the shared console."""

from .console import get_console, print0
from .health import CriticalHealthStop, HealthMonitor, HealthWarning, read_warnings
from .metrics import MetricsSink, read_metrics
from .progress import NO_PHASES, Phases, Progress
from .samples import SampleLogger, read_samples
from .timing import PhaseTimer

__all__ = [
    "CriticalHealthStop",
    "HealthMonitor",
    "HealthWarning",
    "MetricsSink",
    "NO_PHASES",
    "Phases",
    "PhaseTimer",
    "Progress",
    "SampleLogger",
    "get_console",
    "print0",
    "read_metrics",
    "read_samples",
    "read_warnings",
]
