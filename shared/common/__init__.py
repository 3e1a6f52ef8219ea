"""Plumbing every layer may use: the settings all workers share (read from the
environment once, in `app.py`), the request's deadline as an ambient bound, and
background-task helpers. Imports `contracts` and `policy` only; anything may import it."""
