"""Distillation: `StudentTeacher` and `make_bi_student_teacher` (re-exported by
transformer.py, as in the original).

The student's variables live under "student/", the teacher's under "teacher/". The
training loss is (1 - f) * hard_loss + temperature**2 * f * soft_loss: hard_loss the
student's own loss, soft_loss the cross-entropy of the student's logits / temperature
against softmax(teacher logits / temperature) (over real target tokens, divided by the
student's loss denominator), f = fraction_soft once the global step exceeds
distill_start_step (0 before). No gradient reaches the teacher. The teacher's variables
start from teacher_checkpoint (the teacher trained alone, names without "teacher/")
wherever they are created; `initialize(target)` loads it into existing variables.
"""
import gin
import tensorflow as tf

import mesh_tf as mtf
from mesh_tf.checkpoint import discovery


def _named_variables(target):
  """{name: laid-out variable} of a mtf.Lowering, a MeshImpl or such a dict."""
  if isinstance(target, dict):
    return dict(target)
  if hasattr(target, "mesh_to_impl"):
    out = {}
    for impl in target.mesh_to_impl.values():
      out.update(impl.variable_store)
    return out
  if hasattr(target, "variable_store"):
    return dict(target.variable_store)
  raise mtf.MtfError("StudentTeacher.initialize: cannot find variables in %r; give a "
                     "mtf.Lowering, a MeshImpl or a dict name -> variable" % (target,))


def _full_shape(state):
  if hasattr(state, "read_full"):
    return list(state.shape.to_integer_list)
  return state.shape.as_list()


def _strip(names_to_states, prefix):
  return {name[len(prefix):]: state for name, state in names_to_states.items()
          if name.startswith(prefix)}


def _checkpoint_value(reader, key):
  """An initializer returning checkpoint entry `key` (read when the variable is made)."""
  def initializer(shape, dtype=None):
    del shape  # the caller checks the value's shape
    value = tf.constant(reader.get_tensor(key))
    return value if dtype is None else tf.cast(value, dtype)
  return initializer


@gin.configurable(module="transformer")
class StudentTeacher:
  """A student model trained to match a fixed teacher (see the module docstring); both
  Unitransformers or Bitransformers with the same output vocab. temperature and
  fraction_soft are needed for a loss. initialize_student_weights: each student weight
  whose name and shape match a teacher checkpoint entry starts from it too.
  """

  def __init__(self, student, teacher, temperature=None, fraction_soft=None,
               distill_start_step=0, teacher_checkpoint=None,
               initialize_student_weights=False):
    for name, value in list(locals().items()):  # each argument, as its attribute
      if name != "self":
        setattr(self, name, value)

  def __call__(self, inputs, targets):
    """The student's (logits, distillation loss) on a batch."""
    return self.call_simple(inputs, targets, compute_loss=True)

  # The trainer and the decoders see the student's structure and vocab.
  @property
  def encoder(self):
    """The student's encoder (a Bitransformer student only)."""
    return self.student.encoder

  @property
  def decoder(self):
    """The student's decoder (a Bitransformer student only)."""
    return self.student.decoder

  @property
  def output_vocab_dim(self):
    """The student's output vocab dim."""
    return self.student.output_vocab_dim

  def loss_denominator(self, targets, num_microbatches):
    """The student's loss denominator."""
    return self.student.loss_denominator(targets, num_microbatches)

  def _check_hyperparameters(self):
    for name in ("temperature", "fraction_soft"):
      if getattr(self, name) is None:
        raise mtf.MtfError("StudentTeacher: %s must be set to compute the distillation "
                           "loss (gin: transformer.StudentTeacher.%s)" % (name, name))
    if not 0.0 <= self.fraction_soft <= 1.0:
      raise mtf.MtfError("StudentTeacher: fraction_soft must be in [0, 1], got %r"
                         % (self.fraction_soft,))
    if self.temperature <= 0:
      raise mtf.MtfError("StudentTeacher: temperature must be positive, got %r"
                         % (self.temperature,))

  def _fraction_soft(self, mesh):
    """fraction_soft after distill_start_step, else 0 (an mtf scalar read per step)."""
    if not self.distill_start_step:
      return self.fraction_soft
    step = mtf.import_tf_tensor(mesh, mtf.optimize.get_global_step(), [],
                                name="global_step")
    after = mtf.to_float(mtf.greater(step, tf.constant(self.distill_start_step,
                                                       tf.int64)))
    return after * self.fraction_soft

  def call_simple(self, inputs, targets, compute_loss,
                  variable_dtype=mtf.VariableDType(tf.float32), num_microbatches=1,
                  **kargs):
    """The student's logits and (compute_loss) the distillation loss; kargs go to both
    models' call_simple."""
    with mtf.variable_scope("student"):
      student_logits, hard_loss = self.student.call_simple(
          inputs, targets, compute_loss=True, variable_dtype=variable_dtype,
          num_microbatches=num_microbatches, **kargs)
    if not compute_loss:
      return student_logits, None
    self._check_hyperparameters()
    with mtf.variable_scope("teacher"):
      teacher_logits, _ = self.teacher.call_simple(
          inputs, targets, compute_loss=True, variable_dtype=variable_dtype,
          num_microbatches=num_microbatches, **kargs)
    self._initialize_from_teacher_checkpoint(inputs.mesh.graph)
    vocab_dim = self.student.output_vocab_dim
    if teacher_logits.shape != student_logits.shape:
      raise mtf.ShapeError("StudentTeacher: teacher logits %s and student logits %s "
                           "differ; both models need the same output vocab" % (
                               teacher_logits.shape, student_logits.shape))
    dtype = student_logits.dtype
    soft_targets = mtf.stop_gradient(
        mtf.softmax(mtf.stop_gradient(teacher_logits) / self.temperature, vocab_dim))
    soft_loss = mtf.layers.softmax_cross_entropy_with_logits(
        student_logits / self.temperature, soft_targets, vocab_dim)
    weights = mtf.layers.weights_nonzero(targets, dtype=dtype)
    soft_loss = (mtf.reduce_sum(soft_loss * weights) /
                 self.student.loss_denominator(targets, num_microbatches))
    fraction = self._fraction_soft(inputs.mesh)
    loss = ((1.0 - fraction) * hard_loss +
            self.temperature ** 2 * fraction * soft_loss)
    return student_logits, loss

  def _initialize_from_teacher_checkpoint(self, graph):
    """Gives the teacher's variables (and, with initialize_student_weights, the matching
    student ones) initializers reading teacher_checkpoint, as the original's
    init_from_checkpoint did (a restored run keeps its own values). Nothing happens
    without a teacher_checkpoint or with fraction_soft 0."""
    if not self.teacher_checkpoint or self.fraction_soft == 0.0:
      return
    reader = tf.train.load_checkpoint(discovery.resolve_prefix(self.teacher_checkpoint))
    shapes = reader.get_variable_to_shape_map()
    prefixes = ["teacher/"] + (["student/"] if self.initialize_student_weights else [])
    for var in graph.all_variables:
      prefix = next((p for p in prefixes if var.name.startswith(p)), None)
      if prefix is None:
        continue
      key = var.name[len(prefix):]
      if key not in shapes or list(shapes[key]) != var.shape.to_integer_list:
        if prefix == "teacher/":
          raise mtf.MtfError(
              "StudentTeacher: teacher variable %r is not in teacher_checkpoint %r as %r "
              "with shape %s" % (var.name, self.teacher_checkpoint, key,
                                 var.shape.to_integer_list))
        continue
      var._initializer = _checkpoint_value(reader, key)  # pylint: disable=protected-access

  def decode(self, *args, **kargs):
    """Decodes with the student (its variables under "student/")."""
    with mtf.variable_scope("student"):
      return self.student.decode(*args, **kargs)

  def initialize(self, target=None):
    """Loads the teacher's weights (and maybe the student's) from teacher_checkpoint into
    target (a mtf.Lowering, a MeshImpl or a dict name -> laid-out variable); returns the
    RestoreResults (teacher, then student when initialize_student_weights)."""
    if not self.teacher_checkpoint:
      raise mtf.MtfError("StudentTeacher.initialize: no teacher_checkpoint is set")
    if target is None:
      raise mtf.MtfError("StudentTeacher.initialize: give the mtf.Lowering or MeshImpl "
                         "holding the variables")
    states = _named_variables(target)
    teacher = _strip(states, "teacher/")
    if not teacher:
      raise mtf.MtfError("StudentTeacher.initialize: no variables under 'teacher/' in "
                         "%r; lower the graph first" % (target,))
    results = [mtf.restore_checkpoint(self.teacher_checkpoint, teacher)]
    if self.initialize_student_weights:
      prefix = discovery.resolve_prefix(self.teacher_checkpoint)
      shapes = tf.train.load_checkpoint(prefix).get_variable_to_shape_map()
      student = {name: state for name, state in _strip(states, "student/").items()
                 if name in shapes and list(shapes[name]) == _full_shape(state)}
      if student:
        results.append(mtf.restore_checkpoint(self.teacher_checkpoint, student))
    return results


@gin.configurable(module="transformer")
def make_bi_student_teacher(input_vocab_size=gin.REQUIRED,
                            output_vocab_size=gin.REQUIRED, layout=None,
                            mesh_shape=None):
  """A StudentTeacher of two Bitransformers, configured under the gin scopes "student"
  and "teacher" (e.g. `teacher/encoder/make_layer_stack.num_layers = 12`)."""
  from models.transformer import transformer  # pylint: disable=g-import-not-at-top
  with gin.config_scope("student"):
    student = transformer.make_bitransformer(
        input_vocab_size=input_vocab_size, output_vocab_size=output_vocab_size,
        layout=layout, mesh_shape=mesh_shape)
  with gin.config_scope("teacher"):
    teacher = transformer.make_bitransformer(
        input_vocab_size=input_vocab_size, output_vocab_size=output_vocab_size,
        layout=layout, mesh_shape=mesh_shape)
  return StudentTeacher(student=student, teacher=teacher)

