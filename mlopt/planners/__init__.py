"""Planners: each a pure `plan(problem, options) -> Plan`.

What mlopt knows about each kind of plan (how `mlopt plan --model` runs it, its files, its validator, its
sweep metrics, its staleness facts, how a simulation applies it) is declared once per kind in
`mlopt/planners/<kind>/kind.py` and listed by `mlopt.planners.registry`; the types are in
`mlopt.planners.protocol`. This package module stays empty so that importing a planner does not import them all.
"""
