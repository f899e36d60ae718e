"""A human's decision on a call: how it is stored (``store``, ``models``) and the rules it
is judged by (``rules``). Below both the call path (``app.calls``) and the approvers' use
cases (``app.approvals``), which import it; it imports neither."""
