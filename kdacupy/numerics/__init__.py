"""The numerics: the float64 reference, the precision model of the kernels, dtypes, parity tolerances."""
