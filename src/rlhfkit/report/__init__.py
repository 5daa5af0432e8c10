"""Reports: plots and a self-contained HTML page of a run or a pipeline."""

from .html import build_report

__all__ = ["build_report"]
