"""The Flower apps a serve kit's ``app/pyproject.toml`` names (installed code; the kit's app carries none).

* ``server_app``: reads the kit's folder from the run config (``kit``), loads the operator's server spec
  (``KIT/server.pkl``), runs the federated loop over the grid, checkpoints to ``KIT/checkpoint`` and writes
  ``KIT/result.pkl`` (the result, or the ServerApp's own error);
* ``client_app``: a stand-in that refuses every message. The devices of a serve kit run ``privasr device serve``
  next to a SuperNode started with ``--isolation process``; a SuperNode running Flower's own ClientApp runtime
  on this app serves nothing.

Importing this module imports Flower (it is imported by Flower's processes only).
"""

from privasr.federated.backends.flower_serve import _client_app, _server_app

__all__ = ["server_app", "client_app"]

server_app = _server_app()
client_app = _client_app()
