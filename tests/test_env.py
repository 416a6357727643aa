"""kdacupy.env: every KDACUPY_* switch is read and checked in one place, bad
values are refused naming the variable and the value, and docs/guide/how-it-works.md lists
them all."""
import re
import warnings
from pathlib import Path

import pytest

from kdacupy import env

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_when_unset_or_empty(monkeypatch):
    for name, sw in env.SWITCHES.items():
        monkeypatch.delenv(name, raising=False)
        assert env.get(name) == sw.default
        monkeypatch.setenv(name, "")
        assert env.get(name) == sw.default


@pytest.mark.parametrize("name, text, value", [
    ("KDACUPY_JIT_VERBOSE", "1", True), ("KDACUPY_JIT_VERBOSE", "0", False),
    ("KDACUPY_EMULATE_ORDER", "reverse", "reverse"), ("KDACUPY_EMULATE_CP_ASYNC", "eager", "eager"),
    ("KDACUPY_EMULATE_CXXFLAGS", '-O0 -g -DX="a b"', ("-O0", "-g", "-DX=a b")),
    ("KDACUPY_EMULATE_THREADS", "3", 3), ("KDACUPY_EMULATE_STACK_KB", "512", 512),
    ("KDACUPY_TUNING_DIR", "/tmp/t", "/tmp/t"),
])
def test_valid_values(monkeypatch, name, text, value):
    monkeypatch.setenv(name, text)
    assert env.get(name) == value


@pytest.mark.parametrize("name, text, allowed", [
    ("KDACUPY_EMULATE_ORDER", "bogus", "forward or reverse"), ("KDACUPY_EMULATE_CP_ASYNC", "lazy", "deferred or eager"),
    ("KDACUPY_JIT_VERBOSE", "yes", "0 or 1"), ("KDACUPY_EMULATE_THREADS", "0", ">= 1"),
    ("KDACUPY_EMULATE_STACK_KB", "big", ">= 1"), ("KDACUPY_EMULATE_CXXFLAGS", '-DX="a', "compiler flags"),
])
def test_bad_values_name_the_variable_and_the_value(monkeypatch, name, text, allowed):
    monkeypatch.setenv(name, text)
    with pytest.raises(env.EnvError) as e:
        env.get(name)
    assert f"{name}={text!r}" in str(e.value) and allowed in str(e.value)
    with pytest.raises(ValueError):  # EnvError is a ValueError
        env.check_all()


def test_an_unknown_switch_warns_once(monkeypatch):
    monkeypatch.setenv("KDACUPY_JIT_VERBSE", "1")
    monkeypatch.setattr(env, "_scanned", [False])  # as in a new process
    with pytest.warns(UserWarning, match="KDACUPY_JIT_VERBSE is not a kdacupy switch"):
        env.get("KDACUPY_JIT_VERBOSE")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.get("KDACUPY_JIT_VERBOSE")


def test_the_library_reads_switches_only_through_env():
    mentioned, direct = set(), []
    for path in (ROOT / "kdacupy").rglob("*"):
        if path.suffix not in (".py", ".h", ".cuh", ".cu"):
            continue
        text = path.read_text()
        mentioned |= set(re.findall(r"\bKDACUPY_[A-Z0-9_]*[A-Z0-9]\b", text))
        if path.name != "env.py" and re.search(r"environ(\.get)?\(?\[?[\"']KDACUPY_|getenv\([\"']KDACUPY_", text):
            direct.append(str(path))
    assert not direct, direct
    assert mentioned <= set(env.SWITCHES), mentioned - set(env.SWITCHES)


def test_the_readme_lists_every_switch():
    assert env.markdown_table() in (ROOT / "docs" / "guide" / "how-it-works.md").read_text()
