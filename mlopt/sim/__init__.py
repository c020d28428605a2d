"""Simulation shared by all planners and `mlopt simulate`: symbolic checking, network timing, bounds, plots."""
