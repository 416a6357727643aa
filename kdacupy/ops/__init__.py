"""Kernel families: one subpackage per family, each with its launchers, layouts and tile lookup."""
