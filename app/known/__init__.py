"""Known values: what the tenant vouches for, kind by kind, so that an ``x-endorsed``
argument holding one is endorsed (``app.runs.endorsement``). Added by an approver when
approving a call (``POST /approve``, ``remember``) or by an admin (``/known-values``),
audited, tenant-scoped; nothing a model sends adds to them."""
