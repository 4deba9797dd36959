"""fakefleet's host side: control planes, the operator, the fake kubelet engine."""
