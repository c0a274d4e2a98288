"""The new modules configured through gin, as the original's users write them: a toy
language model per configuration is built by utils.build_model and trained a few steps
on a 2x2 placement mesh through the trainer's ModelGraph (the loss must go down)."""
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tf as mtf
from models.transformer.trainer import gin_setup
from models.transformer import model_graph
from models.transformer import utils
from models.transformer.context import ModeKeys

COMMON = """
    transformer.Unitransformer.d_model = 8
    transformer.Unitransformer.max_length = 8
    transformer.Unitransformer.vocab_divisor = 8
    transformer.make_layer_stack.num_layers = 1
    transformer_layers.SelfAttention.num_heads = 2
    transformer_layers.SelfAttention.key_value_size = 4
    transformer_layers.DenseReluDense.hidden_size = 8
"""

CONFIGS = {
    "universal_transformer": """
        transformer.make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                               @transformer_layers.DenseReluDense]
        transformer.make_layer_stack.layer_stack_cls = @universal_transformer.UTLayerStack
        universal_transformer.UTLayerStack.act_type = "basic"
        universal_transformer.UTLayerStack.recurrence_type = "act"
        universal_transformer.UTLayerStack.act_max_steps = 2
        universal_transformer.UTLayerStack.act_epsilon = 0.01
        universal_transformer.UTLayerStack.num_rec_steps = 2
        universal_transformer.UTLayerStack.num_inrecurrence_layers = 1
        universal_transformer.UTLayerStack.position_start_index = 0
        universal_transformer.UTLayerStack.add_or_concat_timing_signal = "add"
        universal_transformer.UTLayerStack.step_timing_signal_type = "learned"
        universal_transformer.UTLayerStack.add_position_timing_signal = True
        universal_transformer.UTLayerStack.add_step_timing_signal = True
        universal_transformer.UTLayerStack.mix_with_transformer_before_ut = False
        universal_transformer.UTLayerStack.mix_with_transformer_after_ut = True
        universal_transformer.UTLayerStack.gates_inputs = "s"
        universal_transformer.UTLayerStack.gate_ffn_layer = "dense"
        universal_transformer.UTLayerStack.use_gated_transformer = False
        universal_transformer.UTLayerStack.gating_type = "highway"
        universal_transformer.UTLayerStack.num_vanilla_transformer_layers = 1
    """,
    "evolved_transformer": """
        transformer.make_layer_stack.layers = [
            @evolved_transformer.GatedLinearUnitLayer,
            @evolved_transformer.DecoderConvolutionalLayer,
            @evolved_transformer.DecoderAttentionLayer,
            @transformer_layers.DenseReluDense]
        evolved_transformer.DecoderConvolutionalLayer.d_model = 8
        evolved_transformer.DecoderConvolutionalLayer.dropout_rate = 0.1
        evolved_transformer.DecoderAttentionLayer.base_num_heads = 1
    """,
    "fixup": """
        transformer.make_layer_stack.layers = [@fixup_layers.SelfAttentionFixup,
                                               @fixup_layers.DenseReluDenseFixup]
        fixup_layers.SelfAttentionFixup.num_blocks = 2
        fixup_layers.SelfAttentionFixup.num_heads = 2
        fixup_layers.SelfAttentionFixup.key_value_size = 4
        fixup_layers.DenseReluDenseFixup.num_blocks = 2
        fixup_layers.DenseReluDenseFixup.hidden_size = 8
        transformer.LayerStack.sublayers_initial = []
        transformer.LayerStack.sublayers_per_layer = [
            @fixup_layers.sublayer_fixup_shift, @transformer.sublayer_call_layer,
            @fixup_layers.sublayer_fixup_scale, @transformer.sublayer_residual]
        transformer.LayerStack.sublayers_final = []
    """,
    "experts_and_memory": """
        transformer.make_layer_stack.layers = [
            @transformer_layers.SelfAttention, @moe.MoE2D,
            @memory_layers.ProductKeyValueMemory, @heterogeneous_moe.HeterogeneousMoE1D]
        moe.MoE2D.expert_x = 2
        moe.MoE2D.expert_y = 2
        moe.MoE2D.hidden_size = 8
        moe.MoE2D.group_size = 8
        memory_layers.ProductKeyValueMemory.key_size = 4
        memory_layers.ProductKeyValueMemory.n_keys = 4
        memory_layers.ProductKeyValueMemory.n_heads = 2
        memory_layers.ProductKeyValueMemory.knn = 2
        heterogeneous_moe.HeterogeneousMoE1D.num_experts = 4
        heterogeneous_moe.HeterogeneousMoE1D.hidden_size = 8
        heterogeneous_moe.HeterogeneousMoE1D.group_size = 8
        heterogeneous_moe.HeterogeneousMoE1D.heterogeneous_mask_info = "2:4,2:8"
    """,
    "adaptive_softmax": """
        transformer.make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                               @transformer_layers.DenseReluDense]
        transformer.get_vocab_embedding_cls.cls = @adaptive_softmax.AdaptiveSoftmaxVocabEmbedding
        adaptive_softmax.AdaptiveSoftmaxVocabEmbedding.clusters = [
            {"token_count": 8, "embedding_size": 8},
            {"token_count": 8, "embedding_size": 4}]
        transformer.Unitransformer.shared_embedding_and_softmax_weights = True
        transformer.Unitransformer.loss_fn = @adaptive_softmax.adaptive_softmax_loss_fn
    """,
    "mixtape": """
        transformer.make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                               @transformer_layers.DenseReluDense]
        transformer.get_vocab_embedding_cls.cls = @vocab_embeddings.Mixtape
        vocab_embeddings.Mixtape.gate_embedding_size = 4
        transformer.Unitransformer.shared_embedding_and_softmax_weights = True
    """,
}


def toy_lm_graph(config, learning_rate):
  """The train-mode ModelGraph (batch 4, length 8, vocab 16, SGD) of the toy language
  model that COMMON + gin text `config` configure, built by utils.build_model."""
  gin.clear_config()
  gin_setup.import_configurables()
  gin.parse_config(COMMON + config)
  try:
    model = utils.build_model(model_type="lm", input_vocab_size=16, output_vocab_size=16)
    return model_graph.ModelGraph(model, 4, 8, ["targets"], ModeKeys.TRAIN,
                                  mtf.VariableDType(tf.float32),
                                  optimizer=mtf.optimize.SgdOptimizer(learning_rate))
  finally:
    gin.clear_config()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_gin_configured_model_trains_on_a_2x2_mesh(name):
  graph = toy_lm_graph(CONFIGS[name], 0.2)
  impl = mtf.PlacementMeshImpl("rows:2;cols:2", "batch:rows;d_ff:cols",
                               ["/cpu:%d" % i for i in range(4)])
  targets = np.random.RandomState(0).randint(2, 16, size=(4, 8)).astype(np.int32)
  tf.random.set_seed(0)
  losses = []
  for _ in range(4):
    lowering = graph.lowering(impl, {"targets": targets})
    for op in graph.update_ops:
      lowering.lowered_operation(op)
    losses.append(float(lowering.export_to_tf_tensor(graph.loss).numpy()))
  assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
