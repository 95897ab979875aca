"""``import flowlab.keras``: the same module as ``fl.keras`` (``flowlab.nn.keras``), so that Keras code
imports as written: ``from flowlab.keras import layers``, ``from flowlab.keras.layers import Dense``,
``from flowlab.keras.models import Sequential``. Importing this package puts ``flowlab.nn.keras`` (and
each of its loaded submodules, and ``flowlab.keras.optimizers``) in ``sys.modules`` under the
``flowlab.keras`` names: one copy of every class, whichever name a program uses.

>>> import flowlab as fl, flowlab.keras
>>> from flowlab.keras import layers
>>> flowlab.keras is fl.keras and layers is fl.keras.layers
True
"""
import sys

from ..nn import keras as _keras
from ..nn import optimizers as _optimizers

for _name, _module in list(sys.modules.items()):
    if _name.startswith(_keras.__name__ + "."):
        sys.modules.setdefault(__name__ + _name[len(_keras.__name__):], _module)
sys.modules[__name__ + ".optimizers"] = _optimizers
sys.modules[__name__] = _keras    # the import statement hands back what sys.modules holds
