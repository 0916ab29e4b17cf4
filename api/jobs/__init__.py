"""Async single requests: submit, get a job id at once, poll (or be called back) for the result."""
