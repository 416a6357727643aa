"""Emulated kernels run in a forked child, one per test module: a memory error in an
emulated kernel (SIGSEGV, SIGBUS, an abort) fails the test that was running, with the
signal's name, and the rest of the module and of the suite go on.

Without the checks (KDACUPY_EMULATE_CHECK) an out-of-bounds access in an emulated kernel
is an access of the test process itself. Run in the pytest process, one such bug ends the
whole run (rc 134/139) with no summary. So every module that uses the emulation (an item
marked ``emulate``, or a source that names it) runs its tests in a child process forked
from the pytest process: the child runs pytest's own per-test protocol (fixtures, capture,
warnings, skips) and sends each report to the parent, which reports it as if it had run
the test itself. When the child dies, the test it was in gets a failed report naming the
signal, and a new child takes the rest of the module. One fork per module, not per test:
the module's compiled kernels stay loaded from one test to the next. ``--emulate-in-process``
turns this off (e.g. for a debugger); it is off by itself with ``--pdb``, where ``fork`` is
missing, and on a machine with a usable GPU (the pytest process has initialised CUDA, which
does not survive a fork; that machine runs the GPU suite, CI runs without one).

The parent takes the child's reports one test at a time, as its own protocol for that test
runs, so the same works in a pytest-xdist worker (the README runs the suite with
``-n auto --dist loadfile``): the worker reports each test while it runs it, as xdist expects,
and a crash fails one test instead of taking the worker down (xdist would reschedule the rest
of the file, the crashing test included, onto a new worker until its restart limit). Where a
module's tests may be split across workers (another ``--dist``), each test gets a child.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import re
import signal
import struct
import sys
import tempfile
import time
import warnings

import pytest
from _pytest.reports import TestReport

USES_EMULATION = re.compile(r"""backend\s*=\s*["']emulate["']|kdacupy\.emulate|["']emulate["']""")


def pytest_addoption(parser):
    parser.addoption("--emulate-in-process", action="store_true",
                     help="run the tests that use the CPU emulation in the pytest process, not in a forked child "
                          "per module (tests/isolation.py)")


def _enabled(config) -> bool:
    if "enabled" not in _memo:
        _memo["enabled"] = (hasattr(os, "fork") and not config.getoption("--emulate-in-process")
                            and not config.getoption("usepdb", False) and not config.getoption("trace", False)
                            and _no_gpu())
    return _memo["enabled"]


WHOLE_MODULE_SCHEDULES = ("loadfile", "loadscope")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(pytest-xdist, in the controller) Each worker learns the schedule: xdist sets a worker's own
    ``--dist`` to "no", so the worker could not tell by-file from by-test scheduling itself."""
    node.workerinput["kdacupy_dist"] = node.config.getoption("dist", "no")


def _whole_modules(config) -> bool:
    """Whether this process runs every test of a module it runs one (not an xdist worker, or one
    under a by-file / by-scope schedule): then one child serves the whole module."""
    return not hasattr(config, "workerinput") or config.workerinput.get("kdacupy_dist") in WHOLE_MODULE_SCHEDULES


def _no_gpu() -> bool:
    """Where a GPU is usable, the pytest process has initialised CUDA (the gpu marker's check, at
    collection), and CUDA does not survive a fork: a child could not even ask for the device."""
    from kdacupy.jit.device import why_no_gpu
    return why_no_gpu() is not None


_memo: dict = {}


def isolated(items) -> bool:
    """Whether a module's items run in a forked child: they use the emulation (and no GPU)."""
    if any(i.get_closest_marker("gpu") for i in items):
        return False
    if any(i.get_closest_marker("emulate") for i in items):
        return True
    path = getattr(items[0], "path", None)
    try:
        return bool(USES_EMULATION.search(path.read_text())) if path is not None else False
    except OSError:
        return False


_isolated: dict = {}  # module path -> the end index of its items when isolated, else False
_children: dict = {}  # module path -> the child running its tests (the parent reads it test by test)
_in_child = [False]


def _root(item):
    """The collection tree's root (pytest's run object: items, stop flags, setup state)."""
    node = item
    while node.parent is not None:
        node = node.parent
    return node


def _module_span(items, item):
    """(first, end) indices of ``item``'s module in ``items``."""
    i = items.index(item)
    start = i
    while start > 0 and items[start - 1].path == item.path:
        start -= 1
    end = i + 1
    while end < len(items) and items[end].path == item.path:
        end += 1
    return start, end


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A test of an isolated module runs in the module's child (forked at the module's first
    test, or anew after a crash); the parent reports what the child sent for this test."""
    if _in_child[0] or not _enabled(item.config):
        return None
    root = _root(item)
    if item.path not in _isolated:
        start, end = _module_span(root.items, item)
        _isolated[item.path] = isolated(root.items[start:end]) and end
    end = _isolated[item.path]
    if not end:
        return None
    factory = getattr(item.config, "_tmp_path_factory", None)
    if factory is not None:
        factory.getbasetemp()  # made once here, so the children share it
    i = root.items.index(item)
    child = _children.get(item.path)
    if child is None or child.next != i:
        if child is not None:
            child.close(kill=True)
        stop = end if _whole_modules(item.config) else i + 1
        child = _children[item.path] = _Child(root, root.items, i, stop)
    if not child.run(i) or child.next >= child.stop:
        _children.pop(item.path).close()
    if nextitem is None or nextitem.path != item.path:  # the module's last: what it shared with the parent
        if item.path in _children:  # it stopped early (e.g. -x): its other tests are not wanted
            _children.pop(item.path).close(kill=True)
        root._setupstate.teardown_exact(nextitem)
    return True


def _stop_requested(root) -> bool:
    return bool(root.shouldfail or root.shouldstop)


# ---------------------------------------------------------------------------
# the child


def _send(fd, obj):
    data = pickle.dumps(obj)
    view = memoryview(struct.pack("<Q", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


class _Forwarder:
    """In the child: the reports and warnings of the protocol go to the parent."""

    def __init__(self, fd, config):
        self.fd, self.config = fd, config

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        _send(self.fd, ("report", self.config.hook.pytest_report_to_serializable(config=self.config, report=report)))

    @pytest.hookimpl
    def pytest_warning_recorded(self, warning_message, when, nodeid, location):
        w = warning_message
        _send(self.fd, ("warning", dict(message=str(w.message), category=w.category.__name__,
                                        module=w.category.__module__, filename=w.filename, lineno=w.lineno,
                                        when=when, nodeid=nodeid, location=location)))


def _child(root, items, start, stop, fd, crash_file):
    config = root.config
    code = 0
    try:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)  # the parent prints
        for plugin in config.pluginmanager.get_plugins():  # and, in an xdist worker, reports to xdist
            if type(plugin).__name__ == "WorkerInteractor":
                config.pluginmanager.unregister(plugin)
        config.pluginmanager.register(_Forwarder(fd, config), "kdacupy-forwarder")
        faulthandler.enable(file=crash_file, all_threads=False)  # the Python stack at a crash, for the report
        _in_child[0] = True
        stack = root._setupstate.stack  # collectors the parent set up: the parent tears them down, not this copy
        for node in list(stack):
            stack[node] = ([], stack[node][1])
        for i in range(start, stop):
            _send(fd, ("start", i))
            nextitem = items[i + 1] if i + 1 < len(items) else None
            items[i].config.hook.pytest_runtest_protocol(item=items[i], nextitem=nextitem)
            _send(fd, ("done", i))
            if _stop_requested(root):
                break
    except BaseException as e:  # noqa: BLE001  (an error of the machinery: say so in the parent)
        try:
            _send(fd, ("error", f"{type(e).__name__}: {e}"))
        except Exception:  # noqa: BLE001
            pass
        code = 3
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


# ---------------------------------------------------------------------------
# the parent


def _messages(fd):
    buf = b""
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        buf += chunk
        while len(buf) >= 8:
            n = struct.unpack("<Q", buf[:8])[0]
            if len(buf) < 8 + n:
                break
            yield pickle.loads(buf[8:8 + n])
            buf = buf[8 + n:]


def _warn(config, w):
    category = getattr(sys.modules.get(w["module"]), w["category"], UserWarning)
    if not (isinstance(category, type) and issubclass(category, Warning)):
        category = UserWarning
    msg = warnings.WarningMessage(category(w["message"]), category, w["filename"], w["lineno"])
    config.hook.pytest_warning_recorded.call_historic(
        kwargs=dict(warning_message=msg, when=w["when"], nodeid=w["nodeid"], location=w["location"]))


def _died(status) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"killed by {name} (signal {sig})"
    return f"exited with status {os.WEXITSTATUS(status)}"


def _crash_report(item, how, stack, seconds):
    text = (f"the test process was {how} while running this test (in a forked child: tests/isolation.py).\n"
            "An emulated kernel that reads or writes outside its arrays does this without the checks: run the "
            "test with KDACUPY_EMULATE_CHECK=memcheck (or all) to see what and where.")
    lines = []
    for line in stack.strip().splitlines():  # the test's own frames, down to pytest's
        if "/_pytest/" in line or "/pluggy/" in line:
            break
        lines.append(line)
    if lines:
        text += "\n\nPython stack at the crash (faulthandler, most recent call first):\n" + "\n".join(lines)
    return TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, "failed", text, "call",
                      duration=seconds)


class _Child:
    """A forked child running ``items[start:stop]`` in order; ``run(i)`` reports test i from its
    messages (the child runs ahead, bounded by the pipe) and tells whether the child lived
    through it. After a crash the child is gone: the parent forks a new one for the next test."""

    def __init__(self, root, items, start, stop):
        self.root, self.items, self.next, self.stop = root, items, start, stop
        r, w = os.pipe()
        self.crash = tempfile.TemporaryFile()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():  # Python >= 3.12 warns when other threads exist; ours are joined
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(r)
            _child(root, items, start, stop, w, self.crash)
        os.close(w)
        self.pid, self.fd, self.messages, self.status = pid, r, _messages(r), None

    def run(self, i) -> bool:
        config, item = self.root.config, self.items[i]
        started, begun = time.monotonic(), False
        try:
            for kind, payload in self.messages:
                if kind == "start":
                    begun, started = True, time.monotonic()
                    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
                elif kind == "report":
                    rep = config.hook.pytest_report_from_serializable(config=config, data=payload)
                    item.ihook.pytest_runtest_logreport(report=rep)
                elif kind == "warning":
                    _warn(config, payload)
                elif kind == "done":
                    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
                    self.next = i + 1
                    return True
                elif kind == "error":
                    self.close(kill=True)
                    raise RuntimeError(f"the forked child of {item.path} failed: {payload}")
        except BaseException:
            self.close(kill=True)
            raise
        status = self.close()  # the pipe ended inside test i: the child died there
        self.crash.seek(0)
        stack = self.crash.read().decode(errors="replace")
        self.crash.close()
        if not begun:
            item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
        item.ihook.pytest_runtest_logreport(report=_crash_report(item, _died(status), stack,
                                                                 time.monotonic() - started))
        item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
        self.next = i + 1
        return False

    def close(self, kill=False):
        """Reap the child: one that ended its tests or died exits by itself; ``kill``: one whose
        remaining tests are not wanted (another test was asked for, or the parent failed)."""
        if self.pid is None:
            return self.status
        self.messages.close()
        os.close(self.fd)
        pid, self.pid = self.pid, None
        if kill:
            os.kill(pid, signal.SIGKILL)
        _, self.status = os.waitpid(pid, 0)
        return self.status
