"""The one exception type of the emulation backend."""


class EmulationError(RuntimeError):
    """A kernel failed under emulation (deadlock, __trap, bad address, ...) or could not be built."""
