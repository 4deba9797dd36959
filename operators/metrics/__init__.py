"""Simulated usage as real monitors read it, rendered as pure data: the kubelet's resource
metrics (``/metrics/resource``, what metrics-server scrapes) and dcgm-exporter's GPU metrics.
Nothing here does I/O or keeps state: the engine measures (:mod:`operators.engine.usage`) and
serves (:mod:`operators.engine.serving`); these modules only turn samples into Prometheus text.
"""
