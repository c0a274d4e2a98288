"""The Transformer's layers, under the original's module name (transformer_layers).

The layers live in leaf modules by family and are re-exported here, where the
original's users import them and where gin names them (transformer_layers.<Name>):
- core_layers: DenseReluDense, SelfAttention, EncDecAttention, LocalSelfAttention,
  ParallelLayer and the encoder-decoder attention functions (`enc_dec_attention`,
  `enc_dec_attention_bias`, `relative_position_spans`);
- attention_variants: talking-heads, general-bilinear, transparent and branched
  attention, Synthesizer;
- experts_attention: ExpertsSelfAttention, ExpertsEncDecAttention;
- conv_layers: Conv1D, Conv1DLayer, SeparableConv1DLayer and the softmax-normalised
  local convolutions.
"""
# pylint: disable=unused-import
from models.transformer.attention_variants import (
    BranchedEncDecAttention, BranchedSelfAttention, GeneralBilinearEncDecAttention,
    GeneralBilinearSelfAttention, Synthesizer, TalkingHeadsEncDecAttention,
    TalkingHeadsSelfAttention, TransparentEncDecAttention)
from models.transformer.conv_layers import (
    Conv1D, Conv1DLayer, Conv1DLocalAttn, DynamicConv1DLocalAttn,
    LightweightConv1DLocalAttn, LocalConvAttnBlock, SeparableConv1DLayer)
from models.transformer.core_layers import (
    RELATIVE_ATTENTION_TYPES, DenseReluDense, EncDecAttention, LocalSelfAttention,
    ParallelLayer, SelfAttention, _as_memory, _model_dim, attention_params,
    enc_dec_attention, enc_dec_attention_bias, memory_through_caches,
    relative_position_spans)
from models.transformer.experts_attention import (ExpertsEncDecAttention,
                                                  ExpertsSelfAttention)
from models.transformer.transformer_layer import TransformerLayer, class_scope
