"""How a synchronous strategy's all-reduce is configured, under TensorFlow's names:
:class:`CommunicationImplementation` (``AUTO``, ``RING``, ``NCCL``; the older name
``CollectiveCommunication`` is the same enum) and :class:`CommunicationOptions`.

flowlab runs its own collectives (flowlab/cluster/collectives), so each choice maps onto one of
its algorithms:

=========  ==================================================================================
AUTO       flowlab's default, the ring all-reduce
RING       the ring all-reduce (reduce-scatter, then all-gather)
NCCL       NCCL is NVIDIA's GPU library, which flowlab does not bind: the ring all-reduce (the
           algorithm NCCL itself uses for large tensors), over host memory. Said once per
           process with a warning.
=========  ==================================================================================

``timeout_seconds`` becomes the deadline of every collective the strategy runs (flowlab always has
one: 120 s when unset, where TensorFlow would wait for ever). ``bytes_per_pack`` is checked and
kept, but flowlab always packs every gradient of a step into one buffer (one all-reduce per
step), whatever its value.

>>> from flowlab.distribute import experimental as E
>>> opts = E.CommunicationOptions(implementation=E.CommunicationImplementation.RING, timeout_seconds=30)
>>> opts.implementation.name, opts.timeout_seconds
('RING', 30.0)
"""
from __future__ import annotations

import enum
import threading
import warnings

__all__ = ["CommunicationImplementation", "CollectiveCommunication", "CommunicationOptions"]


class CommunicationImplementation(enum.Enum):
    """Which all-reduce a multi-worker strategy uses: ``AUTO`` (flowlab's default, the ring),
    ``RING`` or ``NCCL`` (see the module docstring for what each becomes in flowlab)."""
    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"

    @classmethod
    def of(cls, value) -> "CommunicationImplementation":
        """Accept a member or its name in any case (``"ring"``)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls(value.upper())
            except ValueError:
                pass
        raise ValueError(f"unknown communication implementation {value!r}: use CommunicationImplementation.AUTO, "
                         f".RING or .NCCL")


CollectiveCommunication = CommunicationImplementation   # the name TensorFlow 2.0 - 2.3 used


class CommunicationOptions:
    """Options for the strategy's all-reduces (TensorFlow's ``CommunicationOptions``).

    - ``implementation``: a :class:`CommunicationImplementation` (or its name);
    - ``timeout_seconds``: the deadline of each collective, in seconds (None: flowlab's default);
    - ``bytes_per_pack``: accepted (a whole number >= 0) but without effect: flowlab packs all of a
      step's gradients into one buffer."""

    def __init__(self, bytes_per_pack: int = 0, timeout_seconds: float | None = None,
                 implementation=CommunicationImplementation.AUTO):
        if isinstance(bytes_per_pack, bool) or not isinstance(bytes_per_pack, int) or bytes_per_pack < 0:
            raise ValueError(f"CommunicationOptions: bytes_per_pack must be a whole number >= 0, "
                             f"got {bytes_per_pack!r}")
        if timeout_seconds is not None:
            if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)) \
                    or not timeout_seconds > 0:
                raise ValueError(f"CommunicationOptions: timeout_seconds must be a number of seconds > 0 (or None "
                                 f"for flowlab's default), got {timeout_seconds!r}")
            timeout_seconds = float(timeout_seconds)
        self.bytes_per_pack = bytes_per_pack
        self.timeout_seconds = timeout_seconds
        self.implementation = CommunicationImplementation.of(implementation)

    def merge(self, options: "CommunicationOptions | None") -> "CommunicationOptions":
        """These options with the fields ``options`` sets (not at their defaults) taking over."""
        if options is None:
            return self
        return CommunicationOptions(
            options.bytes_per_pack or self.bytes_per_pack,
            options.timeout_seconds if options.timeout_seconds is not None else self.timeout_seconds,
            options.implementation if options.implementation is not CommunicationImplementation.AUTO
            else self.implementation)

    def __eq__(self, other):
        return isinstance(other, CommunicationOptions) and (self.bytes_per_pack, self.timeout_seconds,
                                                            self.implementation) == (
            other.bytes_per_pack, other.timeout_seconds, other.implementation)

    def __repr__(self):
        return (f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, timeout_seconds={self.timeout_seconds}, "
                f"implementation={self.implementation})")


def communication_options(options=None, communication=None) -> CommunicationOptions:
    """One CommunicationOptions from the strategy's ``communication_options=`` and the older
    ``communication=`` (an implementation); a wrong type gets an error that says what to pass."""
    if options is not None and not isinstance(options, CommunicationOptions):
        if isinstance(options, (CommunicationImplementation, str)):
            options = CommunicationOptions(implementation=options)
        else:
            raise TypeError(f"communication_options must be a fl.distribute.experimental.CommunicationOptions, got "
                            f"{type(options).__name__}; e.g. CommunicationOptions(implementation="
                            f"CommunicationImplementation.RING)")
    base = CommunicationOptions(implementation=CommunicationImplementation.AUTO if communication is None
                                else CommunicationImplementation.of(communication))
    return base.merge(options)


# -- what each implementation becomes ------------------------------------------------------------------
_noted: set = set()
_noted_lock = threading.Lock()


def nccl_note(what: str) -> None:
    """Say once per process that NCCL is not what runs (``what``: the name the user asked for)."""
    with _noted_lock:
        if "nccl" in _noted:
            return
        _noted.add("nccl")
    from ..core import config
    if config.get_visible_devices("GPU"):
        where = ("flowlab has no NCCL binding: the GPUs' gradients are summed in host memory with flowlab's "
                 "ring all-reduce")
    else:
        where = ("NCCL is NVIDIA's library for GPUs and this process has none: flowlab sums the gradients with its "
                 "ring all-reduce instead")
    warnings.warn(f"{what}: {where} (the algorithm NCCL uses too), with the same results.", UserWarning,
                  stacklevel=4)


def algorithm_for(implementation: CommunicationImplementation, what: str = "CommunicationImplementation.NCCL") -> str:
    """flowlab's all-reduce algorithm for ``implementation`` (NCCL: the ring, said once)."""
    if implementation is CommunicationImplementation.NCCL:
        nccl_note(what)
    return "ring"
