"""Recordings of clusters and fleets (what happened, on one clock) and their replay into
FakeClusters (docs/recording.md)."""
