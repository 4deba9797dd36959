"""NVIDIA Xid codes a GPUXid fault can raise, and whether each takes a GPU out of service.

An Xid is the driver's report of a GPU error. Some are the application's doing (13, 31, 43, 45:
the job fails, the GPU is fine) and only signal; the others need a GPU reset or a drain of the
node (double-bit ECC, row remapping, NVLink, "fallen off the bus", uncontained ECC, GSP errors)
and the device plugin reports the GPU unhealthy until then, so its allocatable
``nvidia.com/gpu`` drops. Descriptions follow NVIDIA's Xid catalogue. A code not listed here is
accepted (drivers add codes) and treated as a signal.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Xid:
    code: int
    description: str
    #: The GPU needs a reset or the node a drain: it is out of service until recovery.
    fatal: bool


CATALOGUE: dict[int, Xid] = {xid.code: xid for xid in (
    Xid(13, "Graphics Engine Exception", fatal=False),
    Xid(31, "GPU memory page fault", fatal=False),
    Xid(43, "GPU stopped processing", fatal=False),
    Xid(45, "Preemptive cleanup, due to previous errors", fatal=False),
    Xid(48, "Double Bit ECC Error", fatal=True),
    Xid(63, "ECC page retirement or row remapping recording event", fatal=True),
    Xid(64, "ECC page retirement or row remapper recording failure", fatal=True),
    Xid(74, "NVLink Error", fatal=True),
    Xid(79, "GPU has fallen off the bus", fatal=True),
    Xid(92, "High single-bit ECC error rate", fatal=True),
    Xid(94, "Contained ECC error", fatal=True),
    Xid(95, "Uncontained ECC error", fatal=True),
    Xid(119, "GSP RPC Timeout", fatal=True),
    Xid(120, "GSP Error", fatal=True),
)}


def describe(code: int) -> Xid:
    """The catalogue's entry for ``code``; an unlisted positive code signals only."""
    if isinstance(code, bool) or not isinstance(code, int) or code < 1:
        raise ValueError(f"xid: {code!r} is not an Xid code; give a positive integer such as 79")
    return CATALOGUE.get(code) or Xid(code, f"Xid {code}", fatal=False)

