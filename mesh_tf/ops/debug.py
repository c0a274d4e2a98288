"""Debugging: `Print`, which prints values when the op runs and passes x through."""
import tensorflow as tf

from mesh_tf.graph import Operation


class PrintOperation(Operation):
  """Identity on x that prints `data` (mtf Tensors) with a message when lowered/run."""

  def __init__(self, x, data, message, name=None, **kwargs):
    super().__init__([x] + list(data), name=name or "Print")
    self._message = message
    self._kwargs = kwargs
    self._add_output(x.shape, x.dtype)

  def gradient(self, grad_ys):
    return [grad_ys[0]] + [None] * (len(self.inputs) - 1)

  def lower(self, lowering):
    impl = lowering.mesh_impl(self)
    values = [impl.export_to_tf_tensor(d, lowering.tensors[d]) for d in self.inputs[1:]]
    tf.print(self._message, *values, **self._kwargs)
    lowering.set_tensor_lowering(self.outputs[0], lowering.tensors[self.inputs[0]])


def Print(x, data, message, **kwargs):  # pylint: disable=invalid-name
  """x, printing data (a list of mtf Tensors) with message each time it is computed."""
  return PrintOperation(x, data, message, **kwargs).outputs[0]
