"""All Kubernetes API I/O: raw JSON over aiohttp, one error tree (:mod:`operators.k8s.errors`)."""
