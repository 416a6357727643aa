"""Command-line tools: python -m kdacupy.tune | bench | compile | accuracy."""
