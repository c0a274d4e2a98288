"""One train step lowered in one Lowering: the loss, then every update op."""
import tensorflow as tf


def lower_train_step(lowering, loss, update_ops, skip_nonfinite=False):
  """Emits the loss and every update op in one Lowering; returns the loss tf.Tensor.

  With skip_nonfinite, the updates run only when the loss is finite (inside a tf.cond),
  so a NaN/Inf step leaves every variable and optimizer slot as it was.
  """
  loss_value = lowering.export_to_tf_tensor(loss)

  def apply_updates():
    # everything the updates need first, in graph order: every gradient is made before
    # the first is read (placement's deferred copies then form one segment, not one
    # per weight: slice_segments.py)
    lowering._ensure_lowered(*[op.operation if hasattr(op, "operation") else op  # pylint: disable=protected-access
                               for op in update_ops])
    for op in update_ops:
      lowering.lowered_operation(op)
    return tf.constant(True)
  if skip_nonfinite:
    tf.cond(tf.math.is_finite(loss_value), apply_updates, lambda: tf.constant(False))
  else:
    apply_updates()
  return loss_value
