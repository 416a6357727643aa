"""The commands of the README and of the documentation (docs/) run as written after the README's
set-up commands (``python3 -m venv .venv`` and ``.venv/bin/pip install ...``): none relies on an
activated environment (a bare ``python``, ``pip`` or ``mpiexec``), and the context-parallel demo's
line, taken from the documentation itself, runs under a PATH without the environment's bin
directory."""
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])


def commands():
    """Every command line of the ``bash`` blocks of the README and the docs, comments dropped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def programs(line):
    """The program of each command of ``line`` (split at && and |), after VAR=value prefixes."""
    progs = []
    for part in re.split(r"&&|\|", line):
        words = [w for w in shlex.split(part) if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]
        if words:
            progs.append(words[0])
    return progs


def test_the_readme_has_the_commands_this_test_reads():
    assert any("kdacupy.distributed" in c for c in commands())
    assert len(commands()) >= 8


def test_no_readme_command_needs_an_activated_environment():
    bare = [(c, p) for c in commands() for p in programs(c)
            if p in ("python", "pip", "mpiexec", "mpirun", "pytest")]
    assert not bare, bare
    for c in commands():
        for p in programs(c):
            assert p.startswith(".venv/bin/") or p == "python3", (c, p)  # python3: only to make the venv


def test_the_context_parallel_demo_runs_as_written():
    """The documentation's line, with ``.venv/`` standing for the environment that runs these tests (the
    README's set-up makes it at the top of the checkout), under a PATH that has no MPI and no
    Python of that environment: what a new user's shell has after the set-up."""
    line = next(c for c in commands() if "kdacupy.distributed" in c and "install" not in c)
    venv = Path(sys.prefix)
    if not (venv / "bin" / "mpiexec").exists():
        pytest.skip(f"no mpiexec in {venv}/bin: the set-up's .[distributed] extra brings MPICH")
    shell_line = re.sub(r"(?<![\w/.])\.venv/", str(venv) + "/", line)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "HYDRA_", "MPI"))}
    env["PATH"] = "/usr/bin:/bin"
    r = subprocess.run(["/bin/sh", "-c", shell_line], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, f"{line}\n{r.stdout}\n{r.stderr}"
    ranks = re.findall(r"^rank (\d+): tokens \[\d+, \d+\): output RMSE ratio vs float64 reference ([\d.e+-]+)",
                       r.stdout, flags=re.M)
    assert [int(n) for n, _ in ranks] == list(range(int(re.search(r"-n (\d+)", line).group(1))))
    assert all(float(e) < 1e-2 for _, e in ranks), r.stdout
