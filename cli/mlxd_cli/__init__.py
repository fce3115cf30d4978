"""mlxd's command-line tools. They speak the protocol (mlxd_protocol) and render; they never import mlx
(``mlx-generate --local`` is the one exception: it runs the scheduler in-process, loaded lazily)."""
