"""`mtf.layers`: neural-network layers built from mtf ops, one family per module."""
# pylint: disable=g-importing-member
from mesh_tf.layers.losses import (sigmoid_cross_entropy_with_logits,
                                   softmax_cross_entropy_with_logits, weights_nonzero)
from mesh_tf.layers.initializers import (DenseInitializer, VarianceScalingInitializer,
                                         unit_scaling_convention)
from mesh_tf.layers.dense import (dense, dense_product, get_dense_kernel_weights,
                                  us_einsum)
from mesh_tf.layers.normalization import batch_norm, layer_norm, rms_norm
from mesh_tf.layers.feed_forward import dense_relu_dense
from mesh_tf.layers.masks import (attention_bias_local_2d_block, attention_bias_local_block,
                                  attention_mask_autoregressive, attention_mask_ignore_padding,
                                  attention_mask_same_segment, rename_length_to_memory_length)
from mesh_tf.layers.attention import (compress_mean, dot_product_attention,
                                      multihead_attention, multihead_attention_params,
                                      multihead_attention_vars,
                                      multihead_encdec_attention_incremental,
                                      multihead_self_attention_incremental,
                                      multihead_self_attention_memory_compressed)
from mesh_tf.layers.local_attention import (local_1d_halo_exchange, local_2d_halo_exchange,
                                            local_2d_self_attention_spatial_blocks,
                                            local_self_attention_spatial_blocks,
                                            masked_local_attention_1d,
                                            masked_local_attention_1d_incremental)
from mesh_tf.layers.embedding import embedding, embedding_weights
from mesh_tf.layers.regularization import (annealed_dropout, clip_activation_gradient,
                                           dropout, multiplicative_jitter,
                                           summary_for_clip_activation_gradient)
from mesh_tf.layers.convolution import (conv1d, conv2d, conv2d_transpose,
                                        conv2d_transpose_with_blocks, conv2d_with_blocks,
                                        conv3d, conv3d_transpose,
                                        conv3d_transpose_with_blocks, conv3d_with_blocks,
                                        separable_conv1d)
from mesh_tf.layers.correlation import corr
from mesh_tf.layers.pooling import avg_pool2d, avg_pool3d, max_pool2d, max_pool3d
from mesh_tf.layers.reversible import reversible_half_residual_and_swap
from mesh_tf.layers.pipeline import pipeline, pipeline_schedule
