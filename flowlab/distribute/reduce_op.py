"""``ReduceOp``: how values from several replicas combine into one."""
from __future__ import annotations

import enum

__all__ = ["ReduceOp"]


class ReduceOp(enum.Enum):
    """``SUM`` adds the replicas' values; ``MEAN`` averages them (over examples when an axis is
    reduced too)."""
    SUM = "sum"
    MEAN = "mean"

    @classmethod
    def of(cls, op) -> "ReduceOp":
        """Accept a ReduceOp or its name (``"sum"``, ``"MEAN"``)."""
        if isinstance(op, cls):
            return op
        try:
            return cls(str(op).lower())
        except ValueError:
            raise ValueError(f"unknown reduction {op!r}: use ReduceOp.SUM or ReduceOp.MEAN") from None
