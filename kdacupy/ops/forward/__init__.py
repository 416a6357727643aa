"""The chunked forward: kda_prepare + kda_recurrence launchers, byte layouts, tile lookup, limits."""
