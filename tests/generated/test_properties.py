"""Generated cases over the option space (tests/generated/cases.py), checked by their properties
(tests/generated/properties.py): decode steps (pools of either layout and dtype, slot 0, the null
slot -1 or 0 repeated, padding anywhere, 1 to 3 tokens, any head dims) on the precision model and
on the emulated kernel against it, tree verifies (random trees, second roots) against their paths run
alone, and pooled prefills with checkpoints (empty and one-token
sequences, lengths at chunk boundaries, boundaries at a sequence's end). Deterministic in CI (the
``ci`` profile); ``--hypothesis-profile=search`` searches long and keeps what it finds
(tests/generated/conftest.py)."""
import pytest
from hypothesis import given, settings

from .cases import decode_cases, prefill_cases, tree_cases
from .properties import check_decode, check_decode_backends, check_prefill, check_tree
from .record import checked, examples


@settings(max_examples=examples(16))
@given(decode_cases())
def test_decode_pads_touches_nothing_unnamed_and_batches_independently(case):
    checked("decode-model", check_decode, case)


@settings(max_examples=examples(10))
@given(prefill_cases())
def test_pooled_prefill_and_checkpoints_are_the_plain_forward(case):
    checked("prefill-model", check_prefill, case)


@settings(max_examples=examples(8))
@given(tree_cases())
def test_a_tree_verify_is_its_paths_run_alone(case):
    checked("tree-model", check_tree, case)


@pytest.mark.emulate
@settings(max_examples=examples(6))
@given(decode_cases())
def test_emulated_decode_is_the_model_bit_for_bit(case):
    checked("decode-emulate", check_decode_backends, case)
