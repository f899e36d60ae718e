"""Runs: budgets that stop runaway agent loops (docs/api.md, Runs)."""
