"""``model.summary()``: a table of layers, output shapes and weight counts."""
from __future__ import annotations

import numpy as np

__all__ = ["summary_lines"]

WIDTHS = (29, 26, 12)


def _shape_text(shape):
    if shape is None:
        return "?"
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _row(cells, widths):
    return "".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()


def summary_lines(model) -> list:
    """The lines of the summary; a model that has no weights yet gets an error saying how to build it."""
    if not model.built:
        raise ValueError(f"summary: the model {model.name!r} is not built yet, so its shapes are unknown; give the "
                         "first layer input_shape=(...), start with fl.keras.Input(shape=(...)), call "
                         "model.build((None, ...)), or call the model on data first")
    layers = model.layers
    rows = [[f"{layer.name} ({type(layer).__name__})", _shape_text(layer.output_shape), f"{layer.count_params():,}"]
            for layer in layers]
    widths = [max([w, *(len(r[i]) + 2 for r in rows)]) for i, w in enumerate(WIDTHS)]
    rule = "_" * sum(widths)
    lines = [f'Model: "{model.name}"', rule, _row(["Layer (type)", "Output Shape", "Param #"], widths), "=" * sum(widths)]
    for i, row in enumerate(rows):
        lines.append(_row(row, widths))
        lines.append(rule if i < len(rows) - 1 else "=" * sum(widths))
    if not rows:
        lines.append("=" * sum(widths))
    trainable = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    frozen = sum(int(np.prod(w.shape)) for w in model.non_trainable_weights)
    size = sum(int(np.prod(w.shape)) * w.dtype.size for w in model.weights)
    lines += [f"Total params: {trainable + frozen:,} ({_bytes(size)})", f"Trainable params: {trainable:,}",
              f"Non-trainable params: {frozen:,}", rule]
    return lines


def _bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
