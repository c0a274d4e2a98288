"""The variables of the zoo's newer modules carry the original library's names.

Checkpoints of the original load by name, so each module's toy model (built through gin
by utils.build_model, as the original's users configure it) must create exactly these
variables, with these shapes. A rename or a new variable shows up here first.
"""
import pytest

from test_modules_gin_training import CONFIGS as TRAINING_CONFIGS
from test_modules_gin_training import toy_lm_graph

_ATTENTION_AND_FFN = """
    transformer.make_layer_stack.layers = [@transformer_layers.SelfAttention,
                                           @transformer_layers.DenseReluDense]
"""
CONFIGS = {
    "universal_transformer": TRAINING_CONFIGS["universal_transformer"],
    "evolved_transformer": """
        transformer.make_layer_stack.layers = [
            @evolved_transformer.GatedLinearUnitLayer,
            @evolved_transformer.EncoderConvolutionalLayer,
            @evolved_transformer.DecoderConvolutionalLayer,
            @evolved_transformer.DecoderAttentionLayer]
        evolved_transformer.EncoderConvolutionalLayer.d_model = 8
        evolved_transformer.EncoderConvolutionalLayer.dropout_rate = 0.0
        evolved_transformer.DecoderConvolutionalLayer.d_model = 8
        evolved_transformer.DecoderConvolutionalLayer.dropout_rate = 0.0
        evolved_transformer.DecoderAttentionLayer.base_num_heads = 1
    """,
    "fixup": TRAINING_CONFIGS["fixup"],
    "product_key_memory": """
        transformer.make_layer_stack.layers = [@memory_layers.ProductKeyValueMemory]
        memory_layers.ProductKeyValueMemory.key_size = 4
        memory_layers.ProductKeyValueMemory.n_keys = 4
        memory_layers.ProductKeyValueMemory.n_heads = 2
        memory_layers.ProductKeyValueMemory.knn = 2
    """,
    "moe_2d": """
        transformer.make_layer_stack.layers = [@moe.MoE2D]
        moe.MoE2D.expert_x = 2
        moe.MoE2D.expert_y = 2
        moe.MoE2D.hidden_size = 8
        moe.MoE2D.group_size = 8
    """,
    "experts_attention": """
        transformer.make_layer_stack.layers = [@transformer_layers.ExpertsSelfAttention]
        transformer_layers.ExpertsSelfAttention.num_experts = 2
        transformer_layers.ExpertsSelfAttention.hidden_size = 8
        transformer_layers.ExpertsSelfAttention.group_size = 8
        transformer_layers.ExpertsSelfAttention.shared_kv = True
        transformer_layers.ExpertsSelfAttention.num_heads = 2
        transformer_layers.ExpertsSelfAttention.key_value_size = 4
    """,
    "adaptive_softmax": TRAINING_CONFIGS["adaptive_softmax"],
    "mixtape": TRAINING_CONFIGS["mixtape"],
    "mixture_of_softmaxes": _ATTENTION_AND_FFN + """
        transformer.get_vocab_embedding_cls.cls = @vocab_embeddings.MixtureOfSoftmaxes
        vocab_embeddings.MixtureOfSoftmaxes.num_softmaxes = 2
        transformer.Unitransformer.shared_embedding_and_softmax_weights = True
    """,
}


def variables(name):
  """{variable name: shape} of the toy language model of CONFIGS[name]."""
  graph = toy_lm_graph(CONFIGS[name], 0.1)
  return {v.name: tuple(v.shape.to_integer_list)
          for v in sorted(graph.graph.trainable_variables, key=lambda v: v.name)}


def _block(layer, names):
  """{"transformer/block_000/layer_<layer>/<name>": shape} of a LayerStack layer."""
  return {"transformer/block_000/layer_%03d/%s" % (layer, n): s for n, s in names.items()}


# The toy LM's own variables around the layer stack (a LayerStack ends with rms_norm).
_LM = {"transformer/embedding": (16, 8), "transformer/logits/kernel": (8, 16),
       "transformer/positional_embedding": (8, 8)}
_ATTENTION = {"SelfAttention/" + c: (8, 8) for c in "qkvo"}
_FFN = {"DenseReluDense/wi/kernel": (8, 8), "DenseReluDense/wo/kernel": (8, 8)}
_RMS = {"rms_norm/scale": (8,)}
_LAYERS = {**_block(0, {**_ATTENTION, **_RMS}), **_block(1, {**_FFN, **_RMS}),
           "transformer/rms_norm/scale": (8,),
           "transformer/positional_embedding": (8, 8)}


def test_universal_transformer_names():
  """UTLayerStack with ACT, a learned step signal and one vanilla pass after it, as the
  original 0.1.21 names it (listed from it on TF 2.12): the recurrent steps and the
  vanilla pass share the block's weights, each layer pre-normed by a layer norm; the
  halting unit is an unnamed dense (kernel "dense", bias "dense_1"), and the final norm
  is the stack's "layer_prepostprocess" layer norm."""
  norm = {"layer_prepostprocess/layer_norm/layer_norm_bias": (8,),
          "layer_prepostprocess/layer_norm/layer_norm_scale": (8,)}
  expected = {**_LM, **_block(0, {**_ATTENTION, **norm}), **_block(1, {**_FFN, **norm}),
              **{"transformer/" + n: s for n, s in norm.items()},
              "transformer/layer_embedding": (2, 8),
              "transformer/sigmoid_activation_for_pondering/dense/kernel": (8, 1),
              "transformer/sigmoid_activation_for_pondering/dense_1/bias": (1,)}
  assert variables("universal_transformer") == expected


def _separable(scope, taps, channels, out):
  """The original's variables of a SeparableConv1DLayer called in scope."""
  hack = scope + "/separable_conv1d/depthwise_conv_hack/depthwise_dense_"
  names = {hack + "%d/kernel" % k: (channels,) for k in range(taps)}
  names.update({hack + "0/bias": (channels,),
                scope + "/separable_conv1d/pointwise_dense/kernel": (channels, out),
                scope + "/separable_conv1d/pointwise_dense/bias": (out,)})
  return names


def test_evolved_transformer_names():
  """As the original 0.1.21 names them (listed from it on TF 2.12): the sublayers
  called inside a layer get no class-name scope of their own."""
  glu = {"GatedLinearUnitLayer/glu_%d/%s" % (i, v): s
         for i in (0, 1) for v, s in (("bias", (8,)), ("kernel", (8, 8)))}
  norm = "layer_prepostprocess/layer_norm/layer_norm_"
  encoder = {"conv1x1/dense/kernel": (8, 32), "conv3x1/conv2d/kernel": (1, 3, 8, 4),
             norm + "bias": (32,), norm + "scale": (32,),
             **_separable("sep_conv9x1", 9, 32, 4)}
  decoder = {norm + "bias": (16,), norm + "scale": (16,),
             **_separable("sep_conv11x1", 11, 8, 16),
             **_separable("sep_conv7x1_1", 7, 8, 4),
             **_separable("sep_conv7x1_2", 7, 16, 8)}
  attention = {"DecoderAttentionLayer/self_attention/" + c: (8, 8) for c in "qkvo"}
  expected = {**_LM, "transformer/rms_norm/scale": (8,),
              **_block(0, {**glu, **_RMS}),
              **_block(1, {**{"EncoderConvolutionalLayer/" + n: s
                              for n, s in encoder.items()}, **_RMS}),
              **_block(2, {**{"DecoderConvolutionalLayer/" + n: s
                              for n, s in decoder.items()}, **_RMS}),
              **_block(3, {**attention, **_RMS})}
  assert variables("evolved_transformer") == expected


def test_fixup_names():
  """The sublayers' scalars are [1]-shaped "fixup_bias" / "fixup_scale_weight"."""
  scalars = {"fixup_bias": (1,), "fixup_scale_weight": (1,)}
  ffn = {"wi/kernel": (8, 8), "wi_bias": (), "wi_shift": (), "wo/kernel": (8, 8),
         "wo_shift": ()}
  expected = {**_LM,
              **_block(0, {**{"SelfAttentionFixup/" + c: (8, 8) for c in "qkvo"},
                           **scalars}),
              **_block(1, {**{"DenseReluDenseFixup/" + n: s for n, s in ffn.items()},
                           **scalars})}
  assert variables("fixup") == expected


def test_product_key_memory_names():
  norm = "layer_prepostprocess/layer_norm/layer_norm_"
  memory = {"keys": (2, 2, 4, 2), norm + "bias": (2,), norm + "scale": (2,),
            "query/bias": (2, 2, 2), "query/kernel": (8, 2, 2, 2), "values": (16, 8)}
  expected = {**_LM, "transformer/rms_norm/scale": (8,),
              **_block(0, {**{"ProductKeyValueMemory/" + n: s for n, s in memory.items()},
                           **_RMS})}
  assert variables("product_key_memory") == expected


def test_moe_2d_names():
  moe = {"inner_gating/kernel": (2, 8, 2), "outer_gating/kernel": (8, 2),
         "wi/kernel": (2, 2, 8, 8), "wo/kernel": (2, 2, 8, 8)}
  expected = {**_LM, "transformer/rms_norm/scale": (8,),
              **_block(0, {**{"MoE2D/" + n: s for n, s in moe.items()}, **_RMS})}
  assert variables("moe_2d") == expected


def test_experts_attention_names():
  experts = {"k_wo/kernel": (2, 8, 8), "o": (8, 8), "q_wo/kernel": (2, 8, 8),
             "switch_gating/kernel": (8, 2), "wi/kernel": (2, 8, 8)}
  expected = {**_LM, "transformer/rms_norm/scale": (8,),
              **_block(0, {**{"ExpertsSelfAttention/" + n: s
                              for n, s in experts.items()}, **_RMS})}
  assert variables("experts_attention") == expected


@pytest.mark.parametrize("name,embedding", [
    # The head cluster's matrix has a row per tail cluster after its 8 tokens.
    ("adaptive_softmax", {"embedding_0": (9, 8), "embedding_11": (8, 4),
                          "embedding_12": (4, 8)}),
    # 1 frequent id (a tenth of 16): the frequent tables have one row.
    ("mixtape", {"embedding_context_weights": (4, 8, 8),
                 "embedding_context_weights_bias": (4, 8),
                 "embedding_embedding_weights": (16, 8),
                 "embedding_prior_bias": (1, 3), "embedding_prior_gates_vector": (3, 8),
                 "embedding_prior_vocab_vector": (1, 4),
                 "embedding_prior_weights": (3, 4, 8),
                 "embedding_prior_weights_bias": (3, 4)}),
    ("mixture_of_softmaxes", {"embedding_context_weights": (2, 8, 8),
                              "embedding_embedding_weights": (16, 8),
                              "embedding_mixture_weights": (2, 8)}),
])
def test_vocab_embedding_names(name, embedding):
  """The shared embedding-and-softmax classes, in place of transformer/embedding."""
  expected = {**_LAYERS, **{"transformer/" + n: s for n, s in embedding.items()}}
  assert variables(name) == expected
