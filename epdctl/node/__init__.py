"""Programs that run on the nodes with the node's bare Python: standard library only.

``ssh_agent`` (with ``ssh_agent_procs`` pasted in front) answers the ssh launcher; ``supervise``
leads every started process; ``preflight_agent`` (with ``preflight_links``) collects the facts
and measures the links `epdctl check` judges. ``tests/test_node_stdlib.py`` keeps them so.
"""
