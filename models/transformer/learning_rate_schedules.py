"""The original's `mesh_tensorflow.transformer.learning_rate_schedules` module.

The port keeps the schedules in `mesh_tf.learning_rate_schedules` (the optimizers use
them too); this module offers the same functions under the original's transformer module
path, so `from models.transformer import learning_rate_schedules` and gin files that
import `mesh_tensorflow.transformer.learning_rate_schedules` work unchanged. The functions
are the very same objects, so each gin configurable is registered once
(`learning_rate_schedules.<name>` selects it).
"""
from mesh_tf.learning_rate_schedules import constant
from mesh_tf.learning_rate_schedules import constant_learning_rate
from mesh_tf.learning_rate_schedules import learning_rate_schedule_noam
from mesh_tf.learning_rate_schedules import linear_decay
from mesh_tf.learning_rate_schedules import linear_decay_learning_rate
from mesh_tf.learning_rate_schedules import linear_warmup
from mesh_tf.learning_rate_schedules import product_learning_rate
from mesh_tf.learning_rate_schedules import slanted_triangular
from mesh_tf.learning_rate_schedules import truncated_rsqrt

__all__ = [
    "constant", "constant_learning_rate", "learning_rate_schedule_noam", "linear_decay",
    "linear_decay_learning_rate", "linear_warmup", "product_learning_rate",
    "slanted_triangular", "truncated_rsqrt",
]
