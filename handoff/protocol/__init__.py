"""The handoff protocol (docs/handoff.md): a session handed to a specialist and back (moves.py), its tunnel
(tunnels.py), claim checks (claim_checks.py) and the sanitised summaries (summary.py)."""
