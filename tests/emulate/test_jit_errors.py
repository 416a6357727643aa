"""A kernel variant that does not compile is named in the error, with the
compiler's log (here the host compiler's: the emulation loader)."""
import pytest

from kdacupy.emulate import EmulationError
from kdacupy.jit.loaders import EmulateLoader

pytestmark = pytest.mark.emulate


def test_a_failing_variant_is_named_with_the_compiler_log():
    with pytest.raises(EmulationError) as e:
        EmulateLoader().get("kda_prepare", {"KDA_K": 128}, "kda_prepare")  # the other #defines are missing
    msg = str(e.value)
    assert msg.startswith("kda_prepare KDA_K=128: ")
    assert "error" in msg and "KDA_" in msg  # the compiler's diagnostics about the missing defines
