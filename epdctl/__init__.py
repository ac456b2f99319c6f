"""epdctl: deploy, check and rebalance Encoder-Prefill-Decode (EPD) disaggregated VLM serving."""

__version__ = "0.1.0"
