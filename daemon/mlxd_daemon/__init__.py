"""mlxd: the long-lived daemon. It loads the model once and serves the scheduler over ZeroMQ.

The daemon is a thin wrapper: options and start-up (``options.py``, ``main.py``, ``model_setup.py``), the
core without sockets (``core.py``: the scheduler built from the options, the message handlers of
``handlers.py`` in a type→handler table, the reply streams of ``streams.py``), the edge conversions
between wire messages and scheduler requests (``edge.py``, where tokenization happens), the socket loop
(``server.py``) and the one seam the tools may import, for ``mlx-generate --local`` (``local.py``).
"""

__version__ = "0.1.0"
