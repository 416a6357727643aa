"""The chunked forward: kda_prepare + kda_recurrence launchers, byte layouts, tile lookup."""
from . import variants  # noqa: F401  (registers the variants with kdacupy.jit.registry)
