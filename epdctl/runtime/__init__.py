"""Embedded Encoder-Prefill-Decode runtime (torch). Run as ``python -m epdctl.runtime <role>``.

Imports nothing from ``epdctl`` outside this package: the control plane talks to it only
through the rendered command line and the HTTP API.
"""
