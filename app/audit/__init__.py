"""The audit trail: one append-only row per decision or outcome (docs/api.md, Audit)."""
