"""``patch()`` / ``unpatch()`` for an engine's vendored KDA ops: kdacupy's functions swapped
into the engine's op modules and into every loaded module of the engine that holds the
engine's function under its name (a layer that did ``from ...ops.kda import chunk_kda``);
modules imported afterwards pick kdacupy's up from the op modules."""
from __future__ import annotations

import importlib
import sys


class Patcher:
    """One engine's swap: ``package`` (its top-level name), ``modules`` (where its KDA ops may
    live, old and new homes; those importable are used), ``ours`` (name -> kdacupy's function)."""

    def __init__(self, package, modules, ours):
        self.package, self.modules, self.ours = package, tuple(modules), dict(ours)
        self.patched = []  # (module, name, the engine's object) for every attribute replaced

    def patch(self):
        if self.patched:
            return
        homes = []
        for name in self.modules:
            try:
                homes.append(importlib.import_module(name))
            except ImportError:
                continue
        if not homes:
            raise ImportError(f"{self.package}: none of {', '.join(self.modules)} can be imported")
        originals = {}  # the engine's functions, by identity, and the name each stands for
        for home in homes:
            for name in self.ours:
                f = getattr(home, name, None)
                if f is not None and f is not self.ours[name]:
                    originals[id(f)] = (f, name)
        for modname, mod in list(sys.modules.items()):
            if mod is None or not (modname == self.package or modname.startswith(self.package + ".")):
                continue
            for attr, value in list(vars(mod).items()):
                hit = originals.get(id(value))
                if hit is not None and hit[0] is value and attr == hit[1]:
                    self.patched.append((mod, attr, value))
                    setattr(mod, attr, self.ours[attr])

    def unpatch(self):
        while self.patched:
            mod, name, original = self.patched.pop()
            setattr(mod, name, original)
