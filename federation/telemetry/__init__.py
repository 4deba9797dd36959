"""Traces of the whole fleet: the embedded OTLP collector, its span store, and the SDK set-up
that entry points call. Library code elsewhere uses only ``opentelemetry-api``."""
