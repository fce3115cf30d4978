"""mlxd: the long-lived daemon. It loads the model once and serves the scheduler over ZeroMQ.

The daemon is a thin wrapper: options and start-up (``main.py``), the socket loop (``server.py``), the
message handlers (``handlers.py``, a type→handler table) and the edge conversions between wire messages
and scheduler requests (``edge.py``, where tokenization happens).
"""

__version__ = "0.1.0"
