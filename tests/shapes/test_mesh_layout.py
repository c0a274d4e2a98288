"""MeshLayout: the pure owner of layout (no TensorFlow needed)."""
import pickle
import pytest

from mesh_tf.errors import LayoutError
from mesh_tf.shapes.mesh_layout import MeshLayout
from tf_free import run_without_tensorflow


def test_slices_and_layouts():
  ml = MeshLayout("rows:2;cols:4", "batch:rows;d_ff:cols")
  assert ml.size == 8 and ml.ndims == 2
  assert list(ml.tensor_layout("batch:8;d_ff:12;d_model:3")) == [0, 1, None]
  assert ml.slice_shape("batch:8;d_ff:12;d_model:3") == [4, 3, 3]
  assert ml.slice_size("batch:8;d_ff:12") == 12
  assert ml.laid_out_size("batch:8") == 4 * 8
  assert ml.slice_begin("batch:8;d_ff:12", 5) == [4, 3]
  assert ml.split_axes("batch:8;d_ff:12;d_model:3") == {"batch": 0, "d_ff": 1}
  assert ml.axes_size([0, 1]) == 8 and ml.axis_size(1) == 4
  assert ml.processor_groups([1])[0] == [0, 1, 2, 3]


def test_illegal_layout_names_tensor_and_dim():
  ml = MeshLayout("rows:2;cols:4", "batch:rows;d_ff:cols")
  with pytest.raises(LayoutError, match=r'"h".*d_ff=6.*cols'):
    ml.tensor_layout("batch:8;d_ff:6", tensor_name="h")


def test_value_semantics():
  a = MeshLayout("rows:2", "batch:rows")
  b = MeshLayout([("rows", 2)], [("batch", "rows")])
  assert a == b and hash(a) == hash(b)
  assert a != MeshLayout("rows:2", "")
  assert pickle.loads(pickle.dumps(a)) == a
  with pytest.raises(AttributeError):
    a.foo = 1


def test_works_without_tensorflow():
  out = run_without_tensorflow(
      "from mesh_tf.shapes.mesh_layout import MeshLayout\n"
      "print(MeshLayout('r:2', 'b:r').slice_shape('b:4;c:3'))")
  assert out.strip() == "[2, 3]"
