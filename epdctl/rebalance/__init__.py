"""Live role reassignment (`epdctl rebalance`): plan, drain, execute, record, auto policy.

``plan`` is pure (topology in, new topology and commands out); ``drain`` and ``execute`` talk to
the running cluster; ``history`` keeps the audit trail that also versions the applied role map.
"""
