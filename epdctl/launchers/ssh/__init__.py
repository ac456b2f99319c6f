"""The ssh launcher and everything SSH: connections (``conn``), ssh_config and targets
(``config``), the agent each node runs (``agent``), node access and the run folder's node list
(``nodes``), parallel fan-out with per-node results (``fanout``), and the launcher (``launcher``).
"""

from epdctl.launchers.ssh.launcher import SSHLauncher

__all__ = ["SSHLauncher"]
