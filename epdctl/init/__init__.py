"""`epdctl init`: a first topology from what the nodes report (GPUs, NICs), see commands/init.py."""
