"""`mtf.layers`: neural-network layers built from mtf ops, one family per module."""
# pylint: disable=g-importing-member
from mesh_tf.layers.losses import softmax_cross_entropy_with_logits
