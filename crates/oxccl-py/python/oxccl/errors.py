"""oxccl's exceptions. Every one is an :class:`Error` carrying oxccl's
message (which names the rank, the peer, the operation and the buffer);
each also derives from the built-in exception a Python caller would catch
for that kind of failure."""


class Error(Exception):
    """Any failure reported by oxccl."""


class InvalidArgument(Error, ValueError):
    """A wrong argument: a length, a peer or root out of range, a type
    that does not support the reduction. Nothing was changed."""


class InvalidProgram(InvalidArgument):
    """A collective program that does not verify: the message names the
    rank, the channel and the step."""


class InvalidUsage(Error, RuntimeError):
    """A call in the wrong state (a communicator that was aborted, a
    device call without a GPU)."""


class SystemFailure(Error, OSError):
    """The system refused something: a socket, a mapping, a file."""


class PeerError(Error, ConnectionError):
    """A peer died, vanished or sent something unexpected. The
    communicator is poisoned: make a new one (or shrink this one)."""


class Timeout(Error, TimeoutError):
    """A wait passed the communicator's deadline (``OXCCL_TIMEOUT``)."""


class Unavailable(Error, RuntimeError):
    """A feature this build or this machine does not have (no CUDA)."""


class InternalError(Error, RuntimeError):
    """A broken invariant inside oxccl: please report it."""


__all__ = [
    "Error",
    "InvalidArgument",
    "InvalidProgram",
    "InvalidUsage",
    "SystemFailure",
    "PeerError",
    "Timeout",
    "Unavailable",
    "InternalError",
]
