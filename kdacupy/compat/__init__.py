"""Drop-in names of other KDA libraries on kdacupy: ``kdacupy.compat.fla`` (fla-core 0.6.0's
``chunk_kda``, ``fused_recurrent_kda``, ``fused_recurrent_kda_fwd``; needs the ``[torch]`` extra).
Nothing is imported until a submodule is."""
