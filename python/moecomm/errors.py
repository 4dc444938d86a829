"""Exceptions: every non-zero mc_result_t becomes a MoecommError."""
from . import _capi


class MoecommError(Exception):
    """A moecomm call failed. `code` is the mc_result_t, `message` the details."""

    def __init__(self, code, message):
        self.code = int(code)
        self.message = message
        super().__init__(f"{result_string(self.code)} -- {message}" if message else result_string(self.code))


class MoecommTimeout(MoecommError):
    """MC_ERR_TIMEOUT: a peer did not arrive in time (the handle is now aborted)."""


class MoecommInvalid(MoecommError, ValueError):
    """MC_ERR_INVALID_ARG / MC_ERR_INVALID_USAGE: nothing was changed or sent."""


class MoecommCapacity(MoecommError):
    """MC_ERR_CAPACITY: in a packed layout, a rank received more rows than the
    capacity it declared. Raised on every rank alike: the round is dropped,
    nothing was written past a capacity, the handle stays usable and the next
    step is a new dispatch (with a larger capacity, or counted)."""


def result_string(code):
    """mc_result_string: the name and meaning of a result code."""
    return _capi.text(_capi.lib.mc_result_string(int(code)))


def error_for(code, message):
    """The exception instance of the right class for a code."""
    if code == _capi.ERR_TIMEOUT:
        return MoecommTimeout(code, message)
    if code in (_capi.ERR_INVALID_ARG, _capi.ERR_INVALID_USAGE):
        return MoecommInvalid(code, message)
    if code == _capi.ERR_CAPACITY:
        return MoecommCapacity(code, message)
    return MoecommError(code, message)


def check(code, last_error):
    """Raise for a non-zero code; `last_error()` gives the handle's details."""
    if code != _capi.SUCCESS:
        raise error_for(code, last_error())


def invalid(message):
    """A MoecommInvalid for an argument refused in Python before calling C."""
    return MoecommInvalid(_capi.ERR_INVALID_ARG, message)


def last_error():
    """mc_last_error: details of this thread's last failed *_create call."""
    return _capi.text(_capi.lib.mc_last_error())
