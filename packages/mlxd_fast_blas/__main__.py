from mlxd_fast_blas import main

main()
