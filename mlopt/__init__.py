"""mlopt: offline planners for distributed ML training."""

__version__ = "0.1.0"
