"""A static HTML viewer for trajectories: one self-contained file, opened from disk."""

from toolself.viewer.build import build_report, load_attempts

__all__ = ["build_report", "load_attempts"]
