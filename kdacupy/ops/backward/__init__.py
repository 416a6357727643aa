"""The backward kernels (docs/design.md section 9.3): the reverse chain, the per-chunk gradients, the reduction."""
