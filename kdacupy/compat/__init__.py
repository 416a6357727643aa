"""Drop-in names of other KDA callers on kdacupy (they need the ``[torch]`` extra):
``kdacupy.compat.fla`` (fla-core 0.6.0's ``chunk_kda``, ``fused_recurrent_kda``,
``fused_recurrent_kda_fwd``, ``fused_kda_gate``), ``kdacupy.compat.flashkda`` (FlashKDA's
``flash_kda.fwd`` and ``fwd_cp``), ``kdacupy.compat.vllm`` and
``kdacupy.compat.sglang`` (the functions each engine's KDA layer calls from its own vendored
copy of FLA's ops). Nothing is imported until a submodule is."""
