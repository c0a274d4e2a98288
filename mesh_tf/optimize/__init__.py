"""`mtf.optimize`: optimizers that turn gradients into mtf assignment ops.

    grads = mtf.gradients([loss], [v.outputs[0] for v in graph.trainable_variables])
    update_ops = mtf.optimize.AdafactorOptimizer().apply_grads(
        grads, graph.trainable_variables)

Optimizer state lives in ordinary mtf variables ("slots", e.g. `<var>_slot_v`), laid out,
checkpointed and restored like the weights. Rates that follow the global step are read
when the graph is lowered.
"""
# pylint: disable=g-importing-member
from mesh_tf.optimize.global_step import get_global_step, set_global_step, step_num
from mesh_tf.optimize.lowering_time import (TfScalarOperation, lowering_time_scalar,
                                            to_mtf_scalar)
from mesh_tf.optimize.base import Optimizer, clip_by_global_norm, reduce_rms
from mesh_tf.optimize.sgd import MomentumOptimizer, SgdOptimizer
from mesh_tf.optimize.adam import AdamWeightDecayOptimizer
from mesh_tf.optimize.adafactor import (AdafactorOptimizer, adafactor_decay_rate_adam,
                                        adafactor_decay_rate_pow,
                                        adafactor_optimizer_from_hparams)
from mesh_tf.optimize.multi_lr import (AdafactorWithMultiLRSchedule,
                                       AdamWithMultiLRSchedule, compute_lr_for_step,
                                       product_learning_rate)
from mesh_tf.optimize.factory import make_optimizer
