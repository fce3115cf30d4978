from mlxd_daemon.main import main

main()
