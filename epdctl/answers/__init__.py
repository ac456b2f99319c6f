"""The answer check: the user's own questions with expected answers, asked through the router
(`up` before it reports ready, when the topology has a ``check:`` block, and `epdctl check
--answers FILE CLUSTER` at any time). ``questions`` reads the JSONL file, ``ask`` runs it."""
