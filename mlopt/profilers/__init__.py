"""Profilers (`mlopt profile ...`): measured inputs for the planners.

* hardware.py: link alpha/beta per rank pair (TACCL's method) into an mlopt topology file;
* operators.py: per-op implementation times and workspace, merged into a trace for the memory planner;
* contention.py: overlapped and exposed compute/communication samples for LIBRA's contention model.
"""
