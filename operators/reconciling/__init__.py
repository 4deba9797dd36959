"""Pure reconciliation planners of the low-rate kinds: desired + observed → actions, status."""
