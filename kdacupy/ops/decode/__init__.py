"""The fused decode kernel on a state pool: launcher, variants and tile lookup."""
