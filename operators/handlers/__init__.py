"""kopf glue only: decorators' targets that call the pure planners and the I/O layer."""
