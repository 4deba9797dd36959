"""Snapshots of FakeClusters: the file format, saving from etcd and the host API, restoring
through etcd with the member held stopped, and shifting times so that nothing waits longer or
shorter than it had left (docs/snapshots.md)."""
