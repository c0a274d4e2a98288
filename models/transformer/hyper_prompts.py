"""Task prompts prepended to the keys and values of self-attention (multi-task models).

HyperPrompt (He et al. 2022, arXiv 2203.00759) and its MTL-Prompt baseline give every
self-attention layer `prompt_length` extra memory positions, learned per task, that every
query may attend to. The helpers keep the original's names and parameters (offered from
models.transformer.attention).

The task of an example is `context.task_id` where the caller set it (an int Tensor with
the batch dims); otherwise the first id of the example's inputs (`context.inputs`, or
`context.encoder_inputs` in an encoder-decoder's decoder). An id outside [0, task_num)
gets all-zero prompts.
"""
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.errors import MtfError, ShapeError

TASK_DIM_NAME = "task"
PROMPT_LENGTH_DIM_NAME = "prompt_length"
PREFIX_HIDDEN_DIM_NAME = "prefix_hidden"


def _as_dim(dim, name, what):
  """dim as an mtf.Dimension (an int is a size for a dim called name)."""
  if isinstance(dim, mtf.Dimension):
    return dim
  if isinstance(dim, int) and dim > 0:
    return mtf.Dimension(name, dim)
  raise MtfError("%s: %s must be a positive int or an mtf.Dimension, got %r" % (
      what, name, dim), dim=name)


def _prompt_dims(task_num, num_heads, kv_dim, prompt_length, what):
  if prompt_length is None:
    raise MtfError("%s: prompt_length is None; set the number of prompt positions "
                   "(SelfAttention.hyperprompt_length_encoder / _decoder)" % what,
                   rule="prompt_length")
  return (_as_dim(task_num, TASK_DIM_NAME, what),
          _as_dim(prompt_length, PROMPT_LENGTH_DIM_NAME, what),
          mtf.Dimension("heads", num_heads), _as_dim(kv_dim, "d_kv", what))


def _shared(context, key, mtlprompt_share, make):
  """make() for this layer, or with mtlprompt_share the first layer's, kept in
  context.shared_params[key]."""
  if not mtlprompt_share:
    return make()
  if context.shared_params is None:
    raise MtfError("prompts with mtlprompt_share=True need context.shared_params (a "
                   "dict) to hold the shared variables", rule="mtlprompt_share")
  if key not in context.shared_params:
    context.shared_params[key] = make()
  return context.shared_params[key]


def _variable(context, name, dims, stddev):
  return mtf.get_variable(context.mesh, name, mtf.Shape(dims),
                          initializer=tf.random_normal_initializer(stddev=stddev),
                          dtype=context.variable_dtype)


def _dropout(context, x, rate):
  if context.train and rate:
    return mtf.dropout(x, rate=rate)
  return x


def make_params_mtlprompt(task_num, num_heads, prefix_hidden_dim, kv_dim, context,
                          mtlprompt_share, dropout_rate, prompt_length=None):
  """MTL-Prompt: learned prompt keys and values for every task; returns (prompt_k,
  prompt_v), each [task, prompt_length, heads, d_kv].

  With prefix_hidden_dim None the prompts are the variables "mtlprompt_k" and
  "mtlprompt_v". Otherwise, as in prefix-tuning, a prompt embedding
  "mtlprompt_embedding" [task, prompt_length, prefix_hidden] (dropout_rate in training)
  is projected by "mtlprompt_k_proj" / "mtlprompt_v_proj". With mtlprompt_share the
  layers of one model call share the first layer's variables. kv_dim and
  prefix_hidden_dim: ints or mtf.Dimensions.
  """
  what = "make_params_mtlprompt"
  task, length, heads, kv = _prompt_dims(task_num, num_heads, kv_dim, prompt_length, what)

  def make():
    if prefix_hidden_dim is None:
      return tuple(mtf.cast(_variable(context, name, [task, length, heads, kv], 1.0),
                            context.activation_dtype)
                   for name in ("mtlprompt_k", "mtlprompt_v"))
    hidden = _as_dim(prefix_hidden_dim, PREFIX_HIDDEN_DIM_NAME, what)
    embedding = mtf.cast(_variable(context, "mtlprompt_embedding", [task, length, hidden],
                                   1.0), context.activation_dtype)
    embedding = _dropout(context, embedding, dropout_rate)
    out = mtf.Shape([task, length, heads, kv])
    return tuple(
        mtf.einsum([embedding, mtf.cast(
            _variable(context, name, [hidden, heads, kv], hidden.size ** -0.5),
            context.activation_dtype)], output_shape=out)
        for name in ("mtlprompt_k_proj", "mtlprompt_v_proj"))
  key = "mtlprompt/%s" % getattr(context.model, "name", None)
  return _shared(context, key, mtlprompt_share, make)


def make_params_hyperprompt(task_num, num_heads, prefix_hidden_dim, kv_dim, context,
                            mtlprompt_share, dropout_rate, prompt_length, scope=None):
  """HyperPrompt: a layer's global prompts turned into each task's prompts by a
  hypernetwork; returns (prompt_k, prompt_v), each [task, prompt_length, heads, d_kv].

  The layer holds global prompts P_x "hyperprompt_x" [prompt_length, heads, d_kv] (x in
  k, v); the hypernetwork (of size prefix_hidden_dim) holds "task_embedding" [task,
  prefix_hidden], "hyper_down_x" and "hyper_up_x". With task embedding e, D = e .
  hyper_down_x and U = e . hyper_up_x, the prompt is relu(P_x D) U (dropout on the relu
  in training): the paper's U_t(ReLU(D_t(P))). With mtlprompt_share every layer of the
  model call shares the hypernetwork named scope (HyperPrompt-Share), else each layer
  has its own (HyperPrompt-Sep). Other arguments as in make_params_mtlprompt.
  """
  what = "make_params_hyperprompt"
  task, length, heads, kv = _prompt_dims(task_num, num_heads, kv_dim, prompt_length, what)
  if prefix_hidden_dim is None:
    raise MtfError("%s: prefix_hidden_dim is None; the hypernetwork needs a size "
                   "(SelfAttention.hyperprompt_hidden_dim)" % what, rule="prefix_hidden_dim")
  hidden = _as_dim(prefix_hidden_dim, PREFIX_HIDDEN_DIM_NAME, what)
  bottleneck = mtf.Dimension("prompt_hidden", hidden.size)
  dtype = context.activation_dtype

  def make_hypernetwork():
    net = {"task_embedding": _variable(context, "task_embedding", [task, hidden], 1.0)}
    for x in ("k", "v"):
      net["down_" + x] = _variable(context, "hyper_down_" + x, [hidden, kv, bottleneck],
                                   (hidden.size * kv.size) ** -0.5)
      net["up_" + x] = _variable(context, "hyper_up_" + x, [hidden, bottleneck, kv],
                                 (hidden.size * bottleneck.size) ** -0.5)
    return net
  net = _shared(context, "hyperprompt/%s" % (scope or "hyperprompt"), mtlprompt_share,
                make_hypernetwork)
  embedding = mtf.cast(net["task_embedding"], dtype)
  prompts = []
  for x in ("k", "v"):
    global_prompt = mtf.cast(_variable(context, "hyperprompt_" + x, [length, heads, kv],
                                       1.0), dtype)
    down = mtf.einsum([embedding, mtf.cast(net["down_" + x], dtype)],
                      output_shape=mtf.Shape([task, kv, bottleneck]))
    up = mtf.einsum([embedding, mtf.cast(net["up_" + x], dtype)],
                    output_shape=mtf.Shape([task, bottleneck, kv]))
    h = mtf.relu(mtf.einsum([global_prompt, down],
                            output_shape=mtf.Shape([task, length, heads, bottleneck])))
    h = _dropout(context, h, dropout_rate)
    prompts.append(mtf.einsum([h, up], output_shape=mtf.Shape([task, length, heads, kv])))
  return tuple(prompts)


def task_ids(context, scope_encoder_or_decoder, task_num):
  """Each example's task index (an int Tensor with the batch dims; see the module
  docstring)."""
  explicit = getattr(context, "task_id", None)
  if explicit is not None:
    return explicit
  if scope_encoder_or_decoder == "decoder" and context.encoder_inputs is not None:
    inputs = context.encoder_inputs
  else:
    inputs = context.inputs
  if not isinstance(inputs, mtf.Tensor) or inputs.shape.ndims < 2:
    raise MtfError("task prompts (%s, %d tasks): no task ids; set context.task_id (an int "
                   "Tensor with the batch dims) or give the model its inputs, whose "
                   "first id is the task" % (scope_encoder_or_decoder, task_num),
                   rule="task_id")
  first = mtf.constant(inputs.mesh, 0, dtype=tf.int32)
  return mtf.gather(inputs, first, inputs.shape.dims[-1])


def concat_hyper_prompts_kv(k, v, scope_encoder_or_decoder, use_hyperprompt,
                            memory_length, task_num, num_heads, prefix_hidden_dim, kv_dim,
                            context, mtlprompt_share, dropout_rate, prompt_length):
  """(k, v, memory_length grown by prompt_length): k and v (dims memory_length, "heads"
  and kv_dim) with each example's task prompts (make_params_hyperprompt's if
  use_hyperprompt, else make_params_mtlprompt's) in the first prompt_length positions.
  scope_encoder_or_decoder: "encoder" or "decoder", whose shared prompt parameters and
  whose inputs' task ids to use. Other arguments as in make_params_hyperprompt.
  """
  what = "concat_hyper_prompts_kv"
  if scope_encoder_or_decoder not in ("encoder", "decoder"):
    raise MtfError("%s: scope_encoder_or_decoder must be 'encoder' or 'decoder', got %r"
                   % (what, scope_encoder_or_decoder), rule=str(scope_encoder_or_decoder))
  make = make_params_hyperprompt if use_hyperprompt else make_params_mtlprompt
  kwargs = {"scope": scope_encoder_or_decoder} if use_hyperprompt else {}
  prompt_k, prompt_v = make(task_num, num_heads, prefix_hidden_dim, kv_dim, context,
                            mtlprompt_share, dropout_rate, prompt_length, **kwargs)
  task_dim = prompt_k.shape.get_dim_by_name(TASK_DIM_NAME)
  length_dim = prompt_k.shape.get_dim_by_name(PROMPT_LENGTH_DIM_NAME)
  ids = task_ids(context, scope_encoder_or_decoder, task_num)
  select = mtf.one_hot(ids, task_dim, dtype=prompt_k.dtype)
  prompt_memory = mtf.Dimension(memory_length.name, length_dim.size)
  outputs = []
  for t, prompt in ((k, prompt_k), (v, prompt_v)):
    for d in prompt.shape.dims:
      if d not in (task_dim, length_dim) and d not in t.shape.dims:
        raise ShapeError("%s: %s %s has no dim %s of the prompts %s" % (
            what, t.name, t.shape, d, prompt.shape), tensor=t.name, dim=d.name)
    shape = mtf.replace_dimensions(t.shape, memory_length, prompt_memory)
    for d in select.shape.dims:
      if d != task_dim and d not in shape.dims:
        raise ShapeError("%s: the task ids %s have dim %s, which %s %s lacks" % (
            what, select.shape, d, t.name, t.shape), tensor=t.name, dim=d.name)
    prompt = mtf.rename_dimension(prompt, length_dim.name, memory_length.name)
    # (k may have dims the task ids lack, e.g. a beam: the prompts are the same there.)
    own = [d for d in shape.dims if d in select.shape.dims or d in prompt.shape.dims]
    selected = mtf.broadcast(mtf.einsum([select, prompt], output_shape=mtf.Shape(own)),
                             shape)
    outputs.append(mtf.concat([selected, mtf.cast(t, selected.dtype)], memory_length.name))
  new_memory_length = mtf.Dimension(memory_length.name, memory_length.size + length_dim.size)
  return outputs[0], outputs[1], new_memory_length
