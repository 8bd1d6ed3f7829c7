"""`vllm-doctor serve`: run `vllm serve` as a child, pass its output through, diagnose a bad exit.

This folder owns the wrapper around a live vLLM: its process group and signals (process.py,
signals.py), the pass-through of its output in chunks (passthrough.py) with the capture file
(capture.py), the markers it must notice (markers.py) and the live watch (watch.py) read on the
side, the life of one run (wrapper.py) and the incident report after it (incident.py); what it
is told and found out is in options.py. It may import read/, matching/, knowledge/, capacity/,
render/ and pipeline; nothing imports serve except cli.

How vLLM stops (recorded in shared/vllm-lab, `wrapper-*`): with requests in flight, SIGTERM or
SIGINT leaves the API server hanging on "Waiting for connections to close" and a second Ctrl-C
does not end it, so after a grace period the wrapper sends SIGKILL and says so; after the main
process dies its EngineCore and Worker processes can live on, holding (GPU) memory, so the
wrapper reaps the whole process group before it exits and names every survivor. Everything
vllm-doctor adds (the live watch, the diagnosis, the report) sits behind try/except: a bug or a
bad rule file in vllm-doctor never stops the server, its output, or its exit status.
"""

from vllm_doctor.serve.options import Outcome, ServeOptions
from vllm_doctor.serve.wrapper import run

__all__ = ["Outcome", "ServeOptions", "run"]
