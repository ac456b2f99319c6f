"""The control plane's HTTP side: probes of health and readiness (``probes``), the router's
worker API (``routerctl``), and ``/metrics`` pages read with prometheus_client's parser
(``metrics``, ``metrics_summary``)."""
