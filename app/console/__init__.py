"""The console: browser pages for approvers and auditors over the public API."""
