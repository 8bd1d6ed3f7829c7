"""The one error type a user sees: its message is the whole story, printed as one line.

Every stage raises a subclass of DoctorError for input it cannot use (an unreadable log, a bad
rule file, a config.json that is not JSON, a /metrics URL that does not answer); the CLI prints
`vllm-doctor: <message>` and exits 2. Anything else escaping is our bug (exit 3).
"""

from __future__ import annotations


class DoctorError(Exception):
    """Bad input or an unusable environment, explained in one line for the user."""
