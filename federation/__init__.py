"""fakefleet's federation hub and its client; never imports :mod:`operators`."""
