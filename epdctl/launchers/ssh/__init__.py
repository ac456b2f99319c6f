"""The ssh launcher and everything SSH: connections (``conn``), ssh_config and targets
(``config``), node access, the agent call (the agent itself is ``epdctl.node.ssh_agent``) and the
run folder's node list (``nodes``), parallel fan-out with per-node results (``fanout``), starting
(``starting``), and the launcher (``launcher``).
"""

from epdctl.launchers.ssh.launcher import SSHLauncher

__all__ = ["SSHLauncher"]
