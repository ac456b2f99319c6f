"""Preflight for `epdctl check`: parse node tools, judge nodes, measure transfer links."""
