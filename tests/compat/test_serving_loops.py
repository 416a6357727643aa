"""examples/serving_loop.py's vLLM and SGLang loops (prefill into a pool, decode, the commit of a
speculative step) give what one chunk_kda pass over each request's accepted tokens gives.
(Its fla-core loop is tests/frameworks/test_examples.py's.)"""
import importlib.util
from pathlib import Path

import pytest

from tests.frameworks.common import import_torch, one_thread

pytestmark = pytest.mark.torch
import_torch()
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serving_loop.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("examples_serving_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("loop", ["run_vllm", "run_sglang"])
def test_engine_loop_matches_one_pass(example, loop):
    with one_thread():
        err_o, err_s = getattr(example, loop)(seed=1)
    assert err_o < 1e-6 and err_s < 1e-6  # float32 results; the pool is float32 between steps
