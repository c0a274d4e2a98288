"""One train step lowered in one Lowering: the loss, then every update op."""
import tensorflow as tf


def lower_train_step(lowering, loss, update_ops, skip_nonfinite=False):
  """Emits the loss and every update op in one Lowering; returns the loss tf.Tensor.

  With skip_nonfinite, the updates run only when the loss is finite (inside a tf.cond),
  so a NaN/Inf step leaves every variable and optimizer slot as it was.
  """
  update_inputs = [op.operation if hasattr(op, "operation") else op for op in update_ops]
  lowering.exported_later.add(loss)  # its sum may go with the gradients' (one collective)
  if not skip_nonfinite:
    # the loss and everything the updates need first, in graph order, so placement's
    # deferred copies form one segment (slice_segments.py), not one per weight (the
    # order only helps the speed layer; the values are the same)
    lowering._ensure_lowered(loss.operation, *update_inputs)  # pylint: disable=protected-access
  loss_value = lowering.export_to_tf_tensor(loss)

  def apply_updates():
    lowering._ensure_lowered(*update_inputs)  # pylint: disable=protected-access
    for op in update_ops:
      lowering.lowered_operation(op)
    return tf.constant(True)
  if skip_nonfinite:
    tf.cond(tf.math.is_finite(loss_value), apply_updates, lambda: tf.constant(False))
  else:
    apply_updates()
  return loss_value
