"""Canaries: real requests that prove data crossed every hop of a running cluster.

One package, one idea per module; `epdctl/commands/canary.py` is the only command module
(`up`'s canary and `check --canary`), and it is the only one that prints.

* ``request``  - one image request through the router, its answer judged (``run_canary``);
* ``pairs``    - embedded engine: an image request on every encoder->prefill->decode pair, with
                 the transport bytes each worker counted;
* ``tokens``   - every prefill->decode pair's greedy tokens against a prefill-only run
                 (SGLang's fake-bootstrap trick; SGLang and the embedded engine);
* ``encoders`` - SGLang encoders: embedding-transfer counts grow under image requests;
* ``view``     - tables and lines for the above (strings; the command prints them).

The package's face is ``request``'s API, imported by benchmarks, tests and `rebalance`.
"""

from epdctl.canary.request import (Accuracy, CanaryResult, build_messages, data_url,
                                   measure_accuracy, model_id, run_canary)

__all__ = ["Accuracy", "CanaryResult", "build_messages", "data_url", "measure_accuracy",
           "model_id", "run_canary"]
