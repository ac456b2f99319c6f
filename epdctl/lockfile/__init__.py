"""``epdctl.lock``: a record of what one `up` ran, and its comparison with another.

Written by every `up` into the cluster's run folder (``build`` + ``write``); `up --lock FILE`
copies it out, `up --locked FILE` refuses to start when what it would run differs (``diff``),
and `epdctl diff A B` prints the changed fields. See docs/gpu-site.md.
"""
