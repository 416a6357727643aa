"""The exception types of the emulation backend."""
from ..env import EnvError


class EmulationError(RuntimeError):
    """A kernel failed under emulation (deadlock, __trap, bad address, ...) or could not be built."""


class EmulationEnvError(EnvError, EmulationError):
    """A KDACUPY_EMULATE_* switch holds a value the emulation cannot use: the documented
    ``kdacupy.env.EnvError`` (a ValueError), and an EmulationError too, since the launch fails."""
