"""Autodiff: `gradients` over the mtf graph and `stop_gradient`."""
from mesh_tf.autodiff.gradients import StopGradient, gradients, stop_gradient
