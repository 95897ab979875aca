"""``hvd.callbacks``: the callbacks that keep ranks in step under ``Model.fit`` (as Horovod's
``horovod.tensorflow.keras.callbacks``); implemented in :mod:`flowlab.distribute.horovod`."""
from ..distribute.horovod import (BroadcastGlobalVariablesCallback, LearningRateScheduleCallback,
                                  LearningRateWarmupCallback, MetricAverageCallback)

__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback", "LearningRateScheduleCallback",
           "LearningRateWarmupCallback"]
