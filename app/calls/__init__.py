"""Tool calls: propose, dry-run, execute — the decision and its recording."""
