"""The floor both sides stand on: what ``operators`` and ``federation`` must agree on, spelled
once.

- :mod:`~primitives.keys`: every ``fakefleet.dev/*`` label, annotation, taint and finalizer key;
- :mod:`~primitives.names`: Kubernetes' name rules (DNS labels and subdomains, label keys and
  values) as Python checks, with the words that describe them;
- :mod:`~primitives.selectors`: label selectors with Kubernetes' semantics, and kubectl's
  text form of them;
- :mod:`~primitives.clocks`: time as a dependency;
- :mod:`~primitives.files`: private, atomic, durable files;
- :mod:`~primitives.stamps`: the steps of a Job's life, and when it was seen at each;
- :mod:`~primitives.propagation`: W3C trace context in messages, annotations and headers;
- :mod:`~primitives.flags`: numeric command-line flags, finite and within bounds.

It imports nothing of fakefleet's and nothing of Kubernetes' or gRPC's clients: only the
standard library and ``opentelemetry-api``. What only one side needs stays on that side.
"""
